"""The credential formats the scrubber knows by their shape: one row per format, with the
service that issues it and the published documentation its shape comes from (how a row
becomes a regex, a Hyperscan prefilter and fake examples: format_parts.py).
`python -m stockade.supervisor.policy.scrub.formats` prints the table as Markdown
(formats.md). Nothing here imports the rest of the scrubber.
"""

from __future__ import annotations

from stockade.supervisor.policy.scrub.format_parts import Choice, Format, example, run, uuid
from stockade.supervisor.policy.scrub.format_parts import fmt as _f

__all__ = ["FORMATS", "Format", "example", "table"]

_GH = "GitHub docs: About authentication to GitHub (token prefixes)"
_GL = "GitLab docs: Token overview (token prefixes)"
_SLACK = "Slack API docs: Token types"
_AWS = "AWS IAM User Guide: Unique identifier prefixes"
_AZ = "Microsoft Learn: Azure identifiable secrets (key signatures)"
_DOPPLER = "Doppler docs: Token formats"
_TOKEN_END = "A-Za-z0-9_-"
_ALNUM_END = "A-Za-z0-9"
_HEX_END = "a-f0-9"

# fmt: off
SOURCE_HOSTS = (
    _f("github-pat", "GitHub", _GH, "ghp_", run("alnum", 36, None)),
    _f("github-oauth", "GitHub", _GH, "gho_", run("alnum", 36, None)),
    _f("github-user-to-server", "GitHub", _GH, "ghu_", run("alnum", 36, None)),
    _f("github-server-to-server", "GitHub", _GH, "ghs_", run("alnum", 36, None)),
    _f("github-refresh", "GitHub", _GH, "ghr_", run("alnum", 36, None)),
    _f("github-fine-grained-pat", "GitHub", _GH, "github_pat_", run("word", 22, None)),
    *(
        _f(f"gitlab-{kind}", "GitLab", _GL, f"{prefix}-", run("url", 20, None))
        for kind, prefix in (
            ("pat", "glpat"),
            ("deploy-token", "gldt"),
            ("runner-token", "glrt"),
            ("pipeline-trigger", "glptt"),
            ("ci-job-token", "glcbt"),
            ("scim-token", "glsoat"),
            ("feed-token", "glft"),
            ("incoming-mail", "glimt"),
            ("agent-token", "glagent"),
            ("oauth-secret", "gloas"),
            ("feature-flags", "glffct"),
            ("runner-router", "glrtr"),
            ("workspace-token", "glwt"),
        )
    ),
    _f("gitlab-runner-registration", "GitLab", _GL, "GR1348941", run("url", 20, None)),
    _f("bitbucket-app-password", "Bitbucket", "Atlassian docs: App passwords", "ATBB",
       run("alnum", 32, None)),
    _f("atlassian-api-token", "Atlassian", "Atlassian docs: Manage API tokens", "ATATT3",
       run("url", 50, None)),
    _f("sourcegraph-token", "Sourcegraph", "Sourcegraph docs: Access tokens", "sgp_",
       run("hex", 40), after=_HEX_END),
)
REGISTRIES = (
    _f("npm-token", "npm", "npm docs: About access tokens", "npm_", run("alnum", 36),
       after=_ALNUM_END, negative="npm_" + "x" * 12),
    _f("pypi-token", "PyPI", "PyPI help: API tokens", "pypi-AgE", run("url", 50, None)),
    _f("rubygems-key", "RubyGems", "RubyGems guides: API key scopes", "rubygems_", run("hex", 48),
       after=_HEX_END),
    _f("nuget-key", "NuGet", "NuGet docs: Scoped API keys", "oy2", run("lower", 43),
       after=_ALNUM_END),
    _f("docker-hub-pat", "Docker Hub", "Docker docs: Personal access tokens", "dckr_pat_",
       run("url", 27, None)),
    _f("docker-hub-oat", "Docker Hub", "Docker docs: Organization access tokens", "dckr_oat_",
       run("url", 32, None)),
    _f("artifactory-api-key", "JFrog", "JFrog docs: API keys", "AKCp", run("alnum", 69),
       after=_ALNUM_END),
    _f("artifactory-reference-token", "JFrog", "JFrog docs: Reference tokens", "cmVmdGtuOjAxOjE",
       run("alnum", 49, None)),
    _f("crates-io-token", "crates.io", "crates.io docs: API tokens", "cio", run("alnum", 32),
       after=_ALNUM_END),
    _f("clojars-token", "Clojars", "Clojars wiki: Deploy tokens", "CLOJARS_", run("lower", 60),
       after=_ALNUM_END),
    _f("private-packagist-token", "Private Packagist", "Private Packagist docs: API tokens",
       "packagist_", Choice(("ort", "out", "uut", "urt")), "_", run("hex", 68), after=_HEX_END),
    _f("huggingface-token", "Hugging Face", "Hugging Face docs: User access tokens", "hf_",
       run("alnum", 34, None),
       negative="hf_transfer_enabled_for_all_hub_downloads"),
    _f("huggingface-org-token", "Hugging Face", "Hugging Face docs: User access tokens", "api_org_",
       run("alnum", 34, None)),
)
CI = (
    _f("circleci-pat", "CircleCI", "CircleCI docs: Managing API tokens", "CCIPAT_",
       run("alnum", 22), "_", run("hex", 40), after=_HEX_END),
    _f("buildkite-token", "Buildkite", "Buildkite docs: API access tokens", "bkua_", run("hex", 40),
       after=_HEX_END),
    _f("octopus-api-key", "Octopus Deploy", "Octopus docs: How to create an API key", "API-",
       run("upper", 26, 32), after=_ALNUM_END,
       negative="API-VERSION-2026-11-25"),
    _f("prefect-api-key", "Prefect", "Prefect docs: Manage API keys", "pnu_", run("alnum", 36),
       after=_ALNUM_END),
    *(
        _f(f"doppler-{kind}", "Doppler", _DOPPLER, f"dp.{prefix}.", run("alnum", 40, None))
        for kind, prefix in (
            ("personal", "pt"),
            ("service", "st"),
            ("service-account", "sa"),
            ("cli", "ct"),
            ("scim", "scim"),
            ("audit", "audit"),
        )
    ),
    # a service token names its config ("dp.st.prd.xxxx" in Doppler's service-token docs);
    # config names are lower-case letters, digits, '-' and '_'
    _f("doppler-service-config", "Doppler", "Doppler docs: Service tokens", "dp.st.",
       run("slug", 1, 60), ".", run("alnum", 40, None)),
    _f("terraform-cloud-token", "HashiCorp", "HCP Terraform docs: API tokens", run("alnum", 14),
       ".atlasv1.", run("url", 60, None)),
    *(
        _f(f"vault-{kind}-token", "HashiCorp", "Vault docs: Tokens (token prefixes)", prefix,
           run("url", 24, None))
        for kind, prefix in (("service", "hvs."), ("batch", "hvb."), ("recovery", "hvr."))
    ),
    _f("pulumi-token", "Pulumi", "Pulumi docs: Access tokens", "pul-", run("hex", 40),
       after=_HEX_END),
    _f("harness-pat", "Harness", "Harness docs: Add and manage API keys", "pat.", run("url", 22),
       ".", run("hex", 24), ".", run("alnum", 20)),
    _f("render-api-key", "Render", "Render docs: API keys", "rnd_", run("alnum", 32, None)),
    _f("netlify-pat", "Netlify", "Netlify docs: Personal access tokens", "nfp_",
       run("alnum", 36, None)),
    _f("flyio-token", "Fly.io", "Fly.io docs: Access tokens", "fo1_", run("url", 43, None)),
    _f("flyio-macaroon", "Fly.io", "Fly.io docs: Access tokens", "FlyV1 fm2_", run("b64", 40, None),
       redact_from=1),
    _f("heroku-api-key", "Heroku", "Heroku Dev Center: API tokens", "HRKU-", run("url", 40, None)),
    _f("scalingo-token", "Scalingo", "Scalingo docs: API tokens", "tk-us-", run("url", 48),
       after=_TOKEN_END),
    _f("sentry-user-token", "Sentry", "Sentry docs: Auth tokens", "sntryu_", run("hex", 64),
       after=_HEX_END),
    _f("sentry-org-token", "Sentry", "Sentry docs: Auth tokens", "sntrys_", run("b64", 30, None)),
    _f("grafana-cloud-token", "Grafana", "Grafana docs: Cloud access policies", "glc_",
       run("b64", 30, None)),
    _f("grafana-service-account", "Grafana", "Grafana docs: Service account tokens", "glsa_",
       run("alnum", 32), "_", run("Hex", 8)),
    _f("postman-api-key", "Postman", "Postman docs: API keys", "PMAK-", run("hex", 24), "-",
       run("hex", 34)),
    _f("databricks-token", "Databricks", "Databricks docs: Personal access tokens", "dapi",
       run("hex", 32), after=_HEX_END),
    _f("newrelic-user-key", "New Relic", "New Relic docs: API keys", "NRAK-", run("upper", 27),
       after=_ALNUM_END),
    _f("newrelic-insert-key", "New Relic", "New Relic docs: API keys", "NRII-", run("url", 32)),
    _f("newrelic-browser-key", "New Relic", "New Relic docs: API keys", "NRJS-", run("hex", 19),
       after=_HEX_END),
    _f("dynatrace-token", "Dynatrace", "Dynatrace docs: Access tokens (token format)", "dt0c01.",
       run("upper", 24), ".", run("upper", 64)),
    _f("honeycomb-ingest-key", "Honeycomb", "Honeycomb docs: API keys", "hcaik_", run("lower", 58),
       after=_ALNUM_END),
    _f("infracost-key", "Infracost", "Infracost docs: API keys", "ico-", run("alnum", 32),
       after=_ALNUM_END),
    _f("tailscale-auth-key", "Tailscale", "Tailscale docs: Auth keys", "tskey-auth-",
       run("url", 20, None)),
    _f("tailscale-api-key", "Tailscale", "Tailscale docs: API access tokens", "tskey-api-",
       run("url", 20, None)),
    _f("tailscale-oauth-secret", "Tailscale", "Tailscale docs: OAuth clients", "tskey-client-",
       run("url", 20, None)),
)
CHAT = (
    _f("slack-bot-token", "Slack", _SLACK, "xoxb-", run("digit", 1), run("url", 8, None)),
    _f("slack-user-token", "Slack", _SLACK, "xoxp-", run("digit", 1), run("url", 8, None)),
    _f("slack-legacy-token", "Slack", _SLACK, "xox", Choice(("a", "o", "r", "s")), "-",
       run("digit", 1), run("url", 8, None)),
    _f("slack-app-token", "Slack", _SLACK, "xapp-", run("digit", 1), run("url", 8, None)),
    _f("slack-config-token", "Slack", _SLACK, "xoxe.xox", Choice(("b", "p")), "-", run("digit", 1),
       run("url", 8, None)),
    _f("slack-config-refresh", "Slack", _SLACK, "xoxe-", run("digit", 1), run("url", 8, None)),
    _f("slack-webhook", "Slack", "Slack API docs: Sending messages using incoming webhooks",
       "hooks.slack.com/", Choice(("services", "workflows", "triggers")), "/", run("path", 8, None),
       redact_from=3, before=""),
    _f("discord-webhook", "Discord", "Discord developer docs: Webhook resource",
       Choice(("discord.com", "discordapp.com")), "/api/webhooks/", run("digit", 17, 20), "/",
       run("url", 20, None), redact_from=2, before=""),
    _f("discord-bot-token", "Discord", "Discord developer docs: Authorization (bot tokens)",
       Choice(("M", "N")), run("alnum", 23, 25), ".", run("url", 6), ".", run("url", 27, 38),
       negative="MTIz.abc.def"),
    _f("telegram-bot-token", "Telegram", "Telegram Bot API: Authorizing your bot",
       run("digit", 5, 10), ":", "AA", run("url", 31, None), redact_from=2, before="0-9",
       negative="12345:AAbb retries"),
    _f("teams-webhook", "Microsoft Teams", "Microsoft Learn: Create incoming webhooks",
       ".webhook.office.com/webhookb2/", run("url", 36, None), redact_from=1, before=""),
    _f("zapier-webhook", "Zapier", "Zapier help: Webhooks by Zapier",
       "hooks.zapier.com/hooks/catch/", run("digit", 5, 10), "/", run("alnum", 6, None),
       redact_from=1, before=""),
    _f("google-chat-webhook", "Google Chat", "Google Chat docs: Incoming webhooks",
       "chat.googleapis.com/v1/spaces/", run("url", 11, None), "/messages?key=", run("url", 39),
       redact_from=3, before=""),
    _f("feishu-webhook", "Feishu / Lark", "Feishu open platform: Custom bot",
       "open.feishu.cn/open-apis/bot/v2/hook/", *uuid(), redact_from=1, before=""),
    _f("twilio-api-key", "Twilio", "Twilio docs: API keys", "SK", run("Hex", 32), after="0-9a-fA-F",
       negative="SK" + "0" * 31),
    _f("sendgrid-key", "SendGrid", "Twilio SendGrid docs: API keys", "SG.", run("url", 22), ".",
       run("url", 43), after=_TOKEN_END),
    _f("mailgun-key", "Mailgun", "Mailgun docs: API keys", "key-", run("hex", 32), after=_HEX_END,
       negative="cache key-0123456789abcdef"),
    _f("mailchimp-key", "Mailchimp", "Mailchimp docs: About API keys", run("hex", 32), "-us",
       run("digit", 1, 2), after=_ALNUM_END,
       negative="d41d8cd98f00b204e9800998ecf8427e-usage"),
    _f("brevo-key", "Brevo", "Brevo docs: API keys", "xkeysib-", run("hex", 64), "-",
       run("alnum", 16)),
    _f("resend-key", "Resend", "Resend docs: API keys", "re_", run("alnum", 8), "_",
       run("alnum", 24), after=_ALNUM_END,
       negative="re_compile_all_patterns"),
    _f("twitter-bearer", "X (Twitter)", "X developer docs: OAuth 2.0 bearer token",
       "AAAAAAAAAAAAAAAAAAAAA", run("alnum", 50, None)),
    _f("facebook-token", "Meta", "Meta for developers: Access tokens", "EAA",
       Choice(("B", "C", "G", "I", "M")), run("alnum", 90, None),
       negative="EAAC and EAAB are header names"),
    _f("instagram-token", "Meta", "Meta for developers: Instagram access tokens", "IGQV",
       run("url", 90, None)),
)
CLOUD = (
    *(
        _f(f"aws-{kind}", "AWS", _AWS, prefix, run("upper", 16), before="A-Za-z0-9",
           after=_ALNUM_END)
        for kind, prefix in (
            ("access-key-id", "AKIA"),
            ("temporary-key-id", "ASIA"),
            ("bearer-key-id", "ABIA"),
            ("context-key-id", "ACCA"),
        )
    ),
    _f("aws-bedrock-key", "AWS", "Amazon Bedrock docs: API keys", "ABSK", run("b64", 100, None)),
    _f("aws-mws-token", "Amazon", "Amazon MWS docs: Authorization tokens", "amzn.mws.", *uuid()),
    _f("google-api-key", "Google Cloud", "Google Cloud docs: API keys", "AIza", run("url", 35),
       before="A-Za-z0-9", after=_TOKEN_END),
    _f("google-oauth-secret", "Google Cloud", "Google Identity docs: OAuth client secrets",
       "GOCSPX-", run("url", 20, None)),
    _f("google-access-token", "Google Cloud", "Google Identity docs: OAuth 2.0 access tokens",
       "ya29.", run("url", 20, None)),
    _f("google-refresh-token", "Google Cloud", "Google Identity docs: OAuth 2.0 refresh tokens",
       "1//0", run("url", 40, None),
       negative="file:///1//0a"),
    _f("azure-ad-client-secret", "Microsoft Entra", "Microsoft Learn: Application client secrets",
       "8Q~", run("azure", 31, 34), before="", lead="[A-Za-z0-9_.~-]{3}",
       negative="abc8Q~short"),
    _f("azure-storage-key", "Azure", _AZ, run("b64", 76), "+ASt", run("b64", 5), "==",
       before="A-Za-z0-9+/"),
    _f("azure-cosmosdb-key", "Azure", _AZ, run("b64", 76), "ACDb", run("b64", 5), "==",
       before="A-Za-z0-9+/"),
    _f("azure-container-registry-key", "Azure", _AZ, run("b64", 42), "+ACR", run("alnum", 6),
       before="A-Za-z0-9+/", after="A-Za-z0-9+/"),
    _f("azure-service-bus-key", "Azure", _AZ, run("b64", 33), "+ASb", run("b64", 5), "=",
       before="A-Za-z0-9+/"),
    _f("azure-function-key", "Azure", _AZ, run("url", 44), "AzFu", run("url", 5),
       Choice(("A", "D")), "==", before="A-Za-z0-9_-"),
    *(
        _f(f"digitalocean-{kind}", "DigitalOcean", "DigitalOcean docs: Personal access tokens",
           f"{prefix}_v1_", run("hex", 64), after=_HEX_END)
        for kind, prefix in (("pat", "dop"), ("oauth", "doo"), ("refresh", "dor"))
    ),
    _f("alibaba-access-key-id", "Alibaba Cloud", "Alibaba Cloud docs: AccessKey pairs", "LTAI",
       run("alnum", 20), before="A-Za-z0-9", after=_ALNUM_END),
    _f("tencent-secret-id", "Tencent Cloud", "Tencent Cloud docs: Access keys", "AKID",
       run("alnum", 32), before="A-Za-z0-9", after=_ALNUM_END),
    _f("scaleway-access-key", "Scaleway", "Scaleway docs: API keys", "SCW", run("upper", 17),
       before="A-Za-z0-9", after=_ALNUM_END),
    _f("yandex-api-key", "Yandex Cloud", "Yandex Cloud docs: API keys", "AQVN", run("url", 35, 38)),
    _f("cloudflare-origin-ca-key", "Cloudflare", "Cloudflare docs: Origin CA keys", "v1.0-",
       run("hex", 24), "-", run("hex", 146)),
    _f("supabase-pat", "Supabase", "Supabase docs: Access tokens", "sbp_", run("hex", 40),
       after=_HEX_END),
    _f("supabase-secret-key", "Supabase", "Supabase docs: API keys", "sb_secret_",
       run("url", 31, None)),
    _f("planetscale-token", "PlanetScale", "PlanetScale docs: Service tokens", "pscale_tkn_",
       run("url", 32, None)),
    _f("planetscale-password", "PlanetScale", "PlanetScale docs: Connection strings", "pscale_pw_",
       run("url", 32, None)),
    _f("planetscale-oauth", "PlanetScale", "PlanetScale docs: OAuth applications", "pscale_oauth_",
       run("url", 32, None)),
    _f("age-secret-key", "age", "age specification: X25519 identities", "AGE-SECRET-KEY-1",
       run("bech32", 58)),
    _f("onepassword-service-account", "1Password", "1Password developer docs: Service accounts",
       "ops_eyJ", run("b64", 100, None)),
    _f("hubspot-pat", "HubSpot", "HubSpot developer docs: Private app access tokens", "pat-",
       Choice(("na1", "eu1")), "-", *uuid()),
    _f("salesforce-access-token", "Salesforce", "Salesforce docs: OAuth access tokens", "00D",
       run("alnum", 12, 15), "!", run("alnum", 96, None),
       negative="00D1234567890AB!short"),
    _f("shopify-access-token", "Shopify", "Shopify docs: Access tokens", "shpat_", run("Hex", 32)),
    _f("shopify-shared-secret", "Shopify", "Shopify docs: Access tokens", "shpss_", run("Hex", 32)),
    _f("shopify-custom-app-token", "Shopify", "Shopify docs: Access tokens", "shpca_",
       run("Hex", 32)),
    _f("shopify-private-app-token", "Shopify", "Shopify docs: Access tokens", "shppa_",
       run("Hex", 32)),
    _f("linear-api-key", "Linear", "Linear docs: API and webhooks", "lin_api_",
       run("alnum", 32, None)),
    _f("linear-oauth-token", "Linear", "Linear docs: OAuth 2.0 authentication", "lin_oauth_",
       run("alnum", 32, None)),
    _f(
        "notion-token", "Notion", "Notion developers: Authorization", "ntn_", run("alnum", 40, None)
    ),
    _f("notion-legacy-secret", "Notion", "Notion developers: Authorization", "secret_",
       run("alnum", 43), after=_ALNUM_END,
       negative="secret_key_base = Rails.application.secret_key_base"),
    _f("airtable-pat", "Airtable", "Airtable docs: Personal access tokens", "pat", run("alnum", 14),
       ".", run("hex", 64), after=_HEX_END,
       negative="pathological.pattern.py"),
    _f("clickup-token", "ClickUp", "ClickUp API docs: Authentication", "pk_", run("digit", 6, 9),
       "_", run("upper", 32), after=_ALNUM_END,
       negative="pk_1234567_short"),
    _f("contentful-pat", "Contentful", "Contentful docs: Personal access tokens", "CFPAT-",
       run("url", 43), after=_TOKEN_END),
    _f("figma-pat", "Figma", "Figma developer docs: Access tokens", "figd_", run("url", 40, None)),
    _f("dropbox-short-lived", "Dropbox", "Dropbox developers: OAuth guide", "sl.",
       run("url", 130, None)),
    _f("typeform-pat", "Typeform", "Typeform developers: Personal access tokens", "tfp_",
       run("url", 44, None)),
    _f("readme-api-key", "ReadMe", "ReadMe docs: API keys", "rdme_", run("lower", 70),
       after=_ALNUM_END),
    _f("frameio-token", "Frame.io", "Frame.io developer docs: Developer tokens", "fio-u-",
       run("url", 64), after=_TOKEN_END),
    _f("mapbox-secret-token", "Mapbox", "Mapbox docs: Access tokens", "sk.eyJ",
       run("url", 20, None), ".", run("url", 22, None)),
    _f("adobe-client-secret", "Adobe", "Adobe developer docs: OAuth credentials", "p8e-",
       run("alnum", 32), after=_ALNUM_END),
)
PAYMENT = (
    *(
        _f(f"stripe-{kind}", "Stripe", "Stripe docs: API keys", prefix, run("alnum", 16, None))
        for kind, prefix in (
            ("secret-live", "sk_live_"),
            ("secret-test", "sk_test_"),
            ("restricted-live", "rk_live_"),
            ("restricted-test", "rk_test_"),
        )
    ),
    _f("stripe-webhook-secret", "Stripe", "Stripe docs: Check webhook signatures", "whsec_",
       run("b64", 24, None)),
    _f("square-access-token", "Square", "Square developer docs: Access tokens", "EAAA",
       run("url", 60, None)),
    _f("square-oauth-secret", "Square", "Square developer docs: OAuth", "sq0csp-", run("url", 43),
       after=_TOKEN_END),
    _f("square-legacy-token", "Square", "Square developer docs: Access tokens", "sq0atp-",
       run("url", 22), after=_TOKEN_END),
    _f("braintree-access-token", "PayPal Braintree", "Braintree docs: Access tokens",
       "access_token$production$", run("lower", 16), "$", run("hex", 32), after=_HEX_END),
    _f("flutterwave-secret-key", "Flutterwave", "Flutterwave docs: API keys", "FLWSECK",
       Choice(("_TEST-", "-")), run("hex", 32), "-X"),
    _f("plaid-access-token", "Plaid", "Plaid docs: Access tokens", "access-",
       Choice(("sandbox", "development", "production")), "-", *uuid()),
    _f("shippo-token", "Shippo", "Shippo docs: Authentication", "shippo_", Choice(("live", "test")),
       "_", run("hex", 40), after=_HEX_END),
    _f("easypost-key", "EasyPost", "EasyPost docs: Authentication", "EZ", Choice(("AK", "TK")),
       run("alnum", 54), after=_ALNUM_END),
    _f("duffel-token", "Duffel", "Duffel docs: Authentication", "duffel_", Choice(("test", "live")),
       "_", run("url", 43), after=_TOKEN_END),
)
AI = (
    _f("openai-project-key", "OpenAI", "OpenAI docs: API keys (project keys)", "sk-proj-",
       run("url", 20, None)),
    _f("openai-service-account-key", "OpenAI", "OpenAI docs: Service accounts", "sk-svcacct-",
       run("url", 20, None)),
    _f("openai-admin-key", "OpenAI", "OpenAI docs: Admin API keys", "sk-admin-",
       run("url", 20, None)),
    _f("openai-user-key", "OpenAI", "OpenAI docs: API keys", "sk-", run("alnum", 20, None),
       negative="sk-" + "learn-" * 4),
    _f("openai-none-key", "OpenAI", "OpenAI docs: API keys", "sk-None-", run("url", 20, None)),
    _f("anthropic-api-key", "Anthropic", "Anthropic docs: API keys", "sk-ant-api03-",
       run("url", 20, None)),
    _f("anthropic-admin-key", "Anthropic", "Anthropic docs: Admin API", "sk-ant-admin01-",
       run("url", 20, None)),
    _f("openrouter-key", "OpenRouter", "OpenRouter docs: API keys", "sk-or-v1-",
       run("url", 20, None)),
    _f("groq-key", "Groq", "Groq docs: API keys", "gsk_", run("alnum", 40, None)),
    _f("xai-key", "xAI", "xAI docs: API keys", "xai-", run("alnum", 40, None)),
    _f(
        "perplexity-key", "Perplexity", "Perplexity docs: API keys", "pplx-", run("alnum", 40, None)
    ),
    _f("replicate-token", "Replicate", "Replicate docs: API tokens", "r8_", run("alnum", 37),
       after=_ALNUM_END),
    _f("elevenlabs-key", "ElevenLabs", "ElevenLabs docs: Authentication", "sk_", run("hex", 48),
       after=_HEX_END,
       negative="sk_" + "0123456789abcdef" * 2),
    _f("cerebras-key", "Cerebras", "Cerebras docs: API keys", "csk-", run("lower", 48),
       after=_ALNUM_END),
    _f("langsmith-key", "LangChain", "LangSmith docs: API keys", "lsv2_", Choice(("pt", "sk")), "_",
       run("hex", 32), "_", run("hex", 10)),
    _f("pinecone-key", "Pinecone", "Pinecone docs: API keys", "pcsk_", run("alnum", 5, 8), "_",
       run("alnum", 60, None)),
)
GENERIC = (
    _f("jwt", "JSON Web Token", "RFC 7519: JSON Web Token", "eyJ", run("url", 8, None), ".eyJ",
       run("url", 8, None), ".", run("url", 0, None), negative="eyJhbGciOiJub25lIn0"),
    *(
        _f(f"{scheme.replace('+', '-')}-url-password", service, doc, f"{scheme}://",
           run("url", 1, None), ":", run("alnum", 4, None), "@", redact_from=3, before="")
        for scheme, service, doc in (
            ("postgres", "PostgreSQL", "PostgreSQL docs: Connection URIs"),
            ("postgresql", "PostgreSQL", "PostgreSQL docs: Connection URIs"),
            ("mysql", "MySQL", "MySQL docs: Connecting using URI-like strings"),
            ("mongodb", "MongoDB", "MongoDB docs: Connection strings"),
            ("mongodb+srv", "MongoDB", "MongoDB docs: Connection strings (SRV)"),
            ("redis", "Redis", "Redis docs: Connection URLs"),
            ("rediss", "Redis", "Redis docs: Connection URLs (TLS)"),
            ("amqp", "RabbitMQ", "RabbitMQ docs: URI specification"),
            ("amqps", "RabbitMQ", "RabbitMQ docs: URI specification"),
            ("sqlserver", "SQL Server", "Microsoft Learn: JDBC connection URL"),
            ("clickhouse", "ClickHouse", "ClickHouse docs: Connection strings"),
            ("cockroachdb", "CockroachDB", "CockroachDB docs: Connection parameters"),
        )
    ),
)
# fmt: on
FORMATS: tuple[Format, ...] = (
    *SOURCE_HOSTS,
    *REGISTRIES,
    *CI,
    *CHAT,
    *CLOUD,
    *PAYMENT,
    *AI,
    *GENERIC,
)
"""Every format the scrubber knows by its shape (the context rules, keyword values, private
key blocks and partial views of keys are in context.py and keybody.py)."""


def table() -> str:
    """The formats as a Markdown table (formats.md holds it; a test keeps it current)."""
    rows = [
        "# Credential formats the scrubber knows by shape",
        "",
        "Generated from `FORMATS` in formats.py by",
        "`python -m stockade.supervisor.policy.scrub.formats`; do not edit by hand.",
        f"{len(FORMATS)} formats. `s` is the part redacted; the rest stays readable.",
        "",
        "| name | service | pattern | from |",
        "|---|---|---|---|",
    ]
    for row in FORMATS:
        pattern = row.regex().replace("|", "\\|").replace("`", "\\`")
        rows.append(f"| {row.name} | {row.service} | `{pattern}` | {row.doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table(), end="")
