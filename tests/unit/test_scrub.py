"""The credential scrubber, table-style: one row per format, configured literal secrets in
their encodings, ordinary output left alone, and hostile input in bounded time."""

from __future__ import annotations

import base64
import html
import json
import re
from urllib.parse import quote, quote_plus

import pytest

from stockade.supervisor.policy.scrub.scrubber import REDACTED, Scrubber

R = REDACTED
SCRUBBER = Scrubber()


def run(n: int, chars: str = "aB3dE5gH7jK9mN1pQ2rS4tU6vW8xY0zC") -> str:
    """n token characters: mixed case and digits, obviously not a real credential."""
    return (chars * (n // len(chars) + 1))[:n]


HEX = "0123456789abcdef"
OPENAI = "sk-" + run(48)
OPENAI_PROJECT = f"sk-proj-{run(40)}_{run(20)}-{run(10)}"
OPENAI_SERVICE = f"sk-svcacct-{run(30)}-{run(20)}"
ANTHROPIC = f"sk-ant-api03-{run(80)}-{run(6)}AA"
GITHUB_FINE = f"github_pat_11{run(20)}_{run(59)}"
AWS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_STS_ID = "ASIAY34FZKBOKMUTVV7A"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
JWT_UNSIGNED = "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0In0."
SLACK_BOT = f"xoxb-1234567890-1234567890123-{run(24)}"
SLACK_USER = f"xoxp-1234567890-1234567890123-1234567890123-{run(32)}"
SLACK_APP = f"xapp-1-A0123456789-1234567890123-{run(40)}"
SLACK_HOOK = f"T00000000/B00000000/{run(24)}"
GOOGLE_KEY = "AIza" + run(35)
GOOGLE_SECRET = "GOCSPX-" + run(28)
GOOGLE_TOKEN = "ya29." + run(60)
GITLAB = "glpat-" + run(20)
NPM = "npm_" + run(36)
PYPI = "pypi-AgEIcHlwaS5vcmc" + run(60)
HUGGINGFACE = "hf_" + run(34, "aBcDeFgHiJkLmNoPqRsTuVwXyZ")
TWILIO = "SK" + HEX * 2
SENDGRID = f"SG.{run(22)}.{run(43)}"
DIGITALOCEAN = "dop_v1_" + HEX * 4
B64 = run(40) + "=="


def pem(label: str, body: str = "MIIEowIBAAKCAQEA7bq\nZc3z+9aX/Qm0rVbS\n") -> str:
    return f"-----BEGIN {label}-----\n{body}-----END {label}-----"


ROWS = [
    # From the reference table.
    pytest.param(f"key {OPENAI} used", f"key {R} used", 1, id="openai-legacy"),
    pytest.param(f"OPENAI_API_KEY={OPENAI_PROJECT}", f"OPENAI_API_KEY={R}", 1, id="openai-project"),
    pytest.param(f"use {OPENAI_SERVICE}.", f"use {R}.", 1, id="openai-service-account"),
    pytest.param(f"x-api-key {ANTHROPIC}\n", f"x-api-key {R}\n", 1, id="anthropic"),
    *(
        pytest.param(f"remote {prefix}{run(36)} ok", f"remote {R} ok", 1, id=f"github-{prefix}")
        for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")
    ),
    pytest.param(f"pat: {GITHUB_FINE}", f"pat: {R}", 1, id="github-fine-grained"),
    pytest.param(f"id {AWS_KEY_ID} in use", f"id {R} in use", 1, id="aws-access-key-id"),
    pytest.param(f"{AWS_STS_ID}", R, 1, id="aws-sts-key-id-whole-text"),
    pytest.param("password=hunter2x", f"password={R}", 1, id="generic-password-equals"),
    pytest.param('{"password": "x y z"}', f'{{"password": "{R}"}}', 1, id="generic-json"),
    pytest.param('{"token":"abc"}', f'{{"token":"{R}"}}', 1, id="generic-json-compact"),
    pytest.param("password: x\nuser: me", f"password: {R}\nuser: me", 1, id="generic-yaml"),
    pytest.param("export API_TOKEN=x", f"export API_TOKEN={R}", 1, id="generic-env-export"),
    pytest.param("GITHUB_TOKEN=abc123 make", f"GITHUB_TOKEN={R} make", 1, id="generic-suffix"),
    pytest.param("PASSWORD='a b c'", f"PASSWORD='{R}'", 1, id="generic-uppercase-quoted"),
    pytest.param("db.Passwd = s3cr3t!", f"db.Passwd = {R}", 1, id="generic-passwd"),
    pytest.param("Server=db;Uid=sa;Pwd=Secr3t;", f"Server=db;Uid=sa;Pwd={R};", 1, id="generic-pwd"),
    # A password may end in a keyword without being the name of one.
    pytest.param("password=hunter2pass", f"password={R}", 1, id="value-ends-in-pass"),
    pytest.param("DB_PASSWORD=adminpassword", f"DB_PASSWORD={R}", 1, id="value-ends-in-password"),
    pytest.param("token: secrettoken", f"token: {R}", 1, id="value-ends-in-token"),
    pytest.param("password = MyPassword", f"password = {R}", 1, id="value-pascal-case"),
    pytest.param("login(password=password)", "login(password=password)", 0, id="kwarg-passed-on"),
    pytest.param("f(token=authToken)", "f(token=authToken)", 0, id="camel-case-name"),
    pytest.param("token = GITHUB_TOKEN", "token = GITHUB_TOKEN", 0, id="constant-name"),
    pytest.param("DB_PASS=abc", f"DB_PASS={R}", 1, id="generic-pass-name-part"),
    pytest.param("client_secret: abc-123", f"client_secret: {R}", 1, id="generic-client-secret"),
    pytest.param("X-Api-Key: k123", f"X-Api-Key: {R}", 1, id="generic-api-key-header"),
    pytest.param("apikey=k123&q=1", f"apikey={R}&q=1", 1, id="generic-query-string"),
    pytest.param("secret_key = 'k'", f"secret_key = '{R}'", 1, id="generic-secret-key"),
    pytest.param("PRIVATE_KEY=k1", f"PRIVATE_KEY={R}", 1, id="generic-private-key"),
    pytest.param("'password' => 'pw1'", f"'password' => '{R}'", 1, id="generic-php-arrow"),
    pytest.param("bearer=abc", f"bearer={R}", 1, id="generic-bearer"),
    pytest.param("Password : pw1", f"Password : {R}", 1, id="generic-space-before-colon"),
    pytest.param('token = "unterminated', f'token = "{R}', 1, id="generic-unclosed-quote"),
    # Cloud and service formats.
    pytest.param(
        f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n", f"AWS_SECRET_ACCESS_KEY={R}\n", 1, id="aws-secret"
    ),
    pytest.param(
        f"[default]\naws_access_key_id = {AWS_KEY_ID}\naws_secret_access_key = {AWS_SECRET}\n",
        f"[default]\naws_access_key_id = {R}\naws_secret_access_key = {R}\n",
        2,
        id="aws-credentials-file",
    ),
    pytest.param(
        f'{{"AccessKeyId": "{AWS_STS_ID}", "SecretAccessKey": "{AWS_SECRET}", '
        f'"SessionToken": "{B64}"}}',
        f'{{"AccessKeyId": "{R}", "SecretAccessKey": "{R}", "SessionToken": "{R}"}}',
        3,
        id="aws-sts-json",
    ),
    pytest.param(f"Authorization: Bearer {JWT}", f"Authorization: Bearer {R}", 1, id="jwt-bearer"),
    pytest.param(f"id_token {JWT} end", f"id_token {R} end", 1, id="jwt"),
    pytest.param(f"t={JWT_UNSIGNED};", f"t={R};", 1, id="jwt-unsigned"),
    pytest.param(f"SLACK={SLACK_BOT}", f"SLACK={R}", 1, id="slack-bot"),
    pytest.param(f"[{SLACK_USER}, {SLACK_APP}]", f"[{R}, {R}]", 2, id="slack-user-and-app"),
    pytest.param(
        f"POST https://hooks.slack.com/services/{SLACK_HOOK} 200",
        f"POST https://hooks.slack.com/services/{R} 200",
        1,
        id="slack-webhook",
    ),
    pytest.param(f"STRIPE_KEY={'sk_live_' + run(24)}", f"STRIPE_KEY={R}", 1, id="stripe-live"),
    pytest.param(f"k {'rk_live_' + run(24)} k", f"k {R} k", 1, id="stripe-restricted"),
    pytest.param(f"k {'sk_test_' + run(24)} k", f"k {R} k", 1, id="stripe-test"),
    pytest.param(f"k {'whsec_' + run(32)} k", f"k {R} k", 1, id="stripe-webhook-secret"),
    pytest.param(f"maps?key={GOOGLE_KEY}", f"maps?key={R}", 1, id="google-api-key"),
    pytest.param(f"secret {GOOGLE_SECRET}", f"secret {R}", 1, id="google-oauth-secret"),
    pytest.param(f"gcloud: {GOOGLE_TOKEN}\n", f"gcloud: {R}\n", 1, id="google-access-token"),
    pytest.param(f"Private-Token {GITLAB} x", f"Private-Token {R} x", 1, id="gitlab"),
    pytest.param(f"npm token {NPM}", f"npm token {R}", 1, id="npm"),
    pytest.param(f"twine -p {PYPI}", f"twine -p {R}", 1, id="pypi"),
    pytest.param(f"HF {HUGGINGFACE}", f"HF {R}", 1, id="huggingface"),
    pytest.param(f"sid {TWILIO}", f"sid {R}", 1, id="twilio-api-key"),
    pytest.param(f"{SENDGRID}\n", f"{R}\n", 1, id="sendgrid"),
    pytest.param(f"do {DIGITALOCEAN}", f"do {R}", 1, id="digitalocean"),
    *(
        pytest.param(f"key:\n{pem(label)}\nafter", f"key:\n{R}\nafter", 1, id=f"pem-{label}")
        for label in (
            "RSA PRIVATE KEY",
            "EC PRIVATE KEY",
            "OPENSSH PRIVATE KEY",
            "DSA PRIVATE KEY",
            "PRIVATE KEY",
            "ENCRYPTED PRIVATE KEY",
            "PGP PRIVATE KEY BLOCK",
        )
    ),
    pytest.param(
        pem("RSA PRIVATE KEY", "Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,AB12\n\nMIIE\n"),
        R,
        1,
        id="pem-with-headers",
    ),
    pytest.param(
        json.dumps({"type": "service_account", "private_key": pem("PRIVATE KEY") + "\n"}),
        f'{{"type": "service_account", "private_key": "{R}"}}',
        1,
        id="pem-in-json",
    ),
    pytest.param(
        "$ head -3 id_rsa\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n",
        f"$ head -3 id_rsa\n{R}",
        1,
        id="pem-truncated-hidden-to-end",
    ),
    pytest.param(pem("CERTIFICATE"), pem("CERTIFICATE"), 0, id="pem-certificate-is-public"),
    # Headers and URLs.
    pytest.param(f"Authorization: Basic {B64}", f"Authorization: Basic {R}", 1, id="basic-auth"),
    pytest.param(
        f'curl -H "Authorization: Bearer abc.def" -H "Accept: */*" {"https://x.io"}',
        'curl -H "Authorization: Bearer [REDACTED]" -H "Accept: */*" https://x.io',
        1,
        id="curl-header",
    ),
    pytest.param(
        '{"Authorization": "token abc123"}',
        f'{{"Authorization": "token {R}"}}',
        1,
        id="json-header",
    ),
    pytest.param(
        "proxy-authorization: Basic dXNlcjpw", f"proxy-authorization: Basic {R}", 1, id="proxy-auth"
    ),
    pytest.param(f"> Bearer {run(30)}\n", f"> Bearer {R}\n", 1, id="bearer-anywhere"),
    pytest.param(
        "git clone https://user:hunter2@github.com/o/r.git",
        f"git clone https://user:{R}@github.com/o/r.git",
        1,
        id="url-password",
    ),
    pytest.param(
        "DATABASE_URL=postgres://app:p%40ss@db.internal:5432/app?sslmode=require",
        f"DATABASE_URL=postgres://app:{R}@db.internal:5432/app?sslmode=require",
        1,
        id="postgres-url",
    ),
    pytest.param(
        "mongodb+srv://admin:pa:ss@w0rd@cluster0.mongodb.net/db",
        f"mongodb+srv://admin:{R}@cluster0.mongodb.net/db",
        1,
        id="mongodb-url-password-with-at",
    ),
    pytest.param("redis://:s3cret@cache:6379/0", f"redis://:{R}@cache:6379/0", 1, id="redis-url"),
    pytest.param(
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=ab+c/d==;EndpointSuffix=x",
        f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={R};EndpointSuffix=x",
        1,
        id="azure-storage",
    ),
    pytest.param(
        "https://acct.blob.core.windows.net/c?sv=2022-11-02&sig=AbC%2Fd%3D&se=2030",
        f"https://acct.blob.core.windows.net/c?sv=2022-11-02&sig={R}&se=2030",
        1,
        id="azure-sas",
    ),
    # Credential files and command lines.
    pytest.param(
        "machine api.heroku.com\n  login me@example.com\n  password c4cd94da15ea0544\n",
        f"machine api.heroku.com\n  login me@example.com\n  password {R}\n",
        1,
        id="netrc",
    ),
    pytest.param(
        f"//registry.npmjs.org/:_authToken={NPM}\n_auth=dXNlcjpwYXNz\n",
        f"//registry.npmjs.org/:_authToken={R}\n_auth={R}\n",
        2,
        id="npmrc",
    ),
    pytest.param(
        f"[pypi]\nusername = __token__\npassword = {PYPI}\n",
        f"[pypi]\nusername = __token__\npassword = {R}\n",
        1,
        id="pypirc",
    ),
    pytest.param(
        f"users:\n- name: u\n  user:\n    token: {B64}\n    client-key-data: {B64}\n",
        f"users:\n- name: u\n  user:\n    token: {R}\n    client-key-data: {R}\n",
        2,
        id="kubeconfig",
    ),
    pytest.param(
        '{"auths": {"ghcr.io": {"auth": "dXNlcjpwYXNz"}}}',
        f'{{"auths": {{"ghcr.io": {{"auth": "{R}"}}}}}}',
        1,
        id="docker-config",
    ),
    pytest.param(
        "mysql --password hunter2 -u root; gh --github-token 'a b' x",
        f"mysql --password {R} -u root; gh --github-token '{R}' x",
        2,
        id="cli-flags",
    ),
    pytest.param("run --api-key=k1 --verbose", f"run --api-key={R} --verbose", 1, id="cli-equals"),
    # More widely used formats.
    *(
        pytest.param(f"key {token} end", f"key {R} end", 1, id=name)
        for name, token in (
            ("openai-none", "sk-None-" + run(48)),
            ("openrouter", "sk-or-v1-" + HEX * 4),
            ("anthropic-admin", "sk-ant-admin01-" + run(80)),
            ("groq", "gsk_" + run(52)),
            ("xai", "xai-" + run(80)),
            ("perplexity", "pplx-" + run(48)),
            ("replicate", "r8_" + run(37)),
            *((f"gitlab-{p}", f"{p}-{run(20)}") for p in ("glptt", "glcbt", "glsoat", "gloas")),
            ("grafana-cloud", "glc_" + run(60)),
            ("grafana-service-account", f"glsa_{run(32)}_{HEX[:8]}"),
            ("aws-abia", "ABIA" + "IOSFODNN7EXAMPLE"),
            ("shopify", "shpat_" + HEX * 2),
            ("atlassian", "ATATT3xFfGF0" + run(60)),
            ("linear", "lin_api_" + run(40)),
            ("notion", "ntn_" + run(46)),
            ("sentry", "sntrys_eyJpYXQiOjE2" + run(40)),
            ("postman", f"PMAK-{(HEX * 2)[:24]}-{(HEX * 3)[:34]}"),
            ("vault", "hvs." + run(90)),
            ("databricks", "dapi" + HEX * 2),
            ("doppler", "dp.pt." + run(43)),
            ("tailscale", "tskey-auth-" + run(40)),
            ("supabase", "sbp_" + (HEX * 3)[:40]),
            ("age", "AGE-SECRET-KEY-1" + ("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L" * 2)[:58]),
        )
    ),
    pytest.param(
        f"https://discord.com/api/webhooks/123456789012345678/{run(68)}",
        f"https://discord.com/api/webhooks/{R}",
        1,
        id="discord-webhook",
    ),
    pytest.param(f"bot 123456:AAH{run(32)}", f"bot 123456:{R}", 1, id="telegram-bot"),
    # Azure AD client secrets: the three characters before `8Q~` stay.
    pytest.param(f"abc8Q~{run(34)}", f"abc{R}", 1, id="azure-ad-client-secret"),
    pytest.param(f"X-Auth: bearer {run(30)}", f"X-Auth: bearer {R}", 1, id="bearer-lowercase"),
    pytest.param("curl -u admin:s3cretpw x", f"curl -u admin:{R} x", 1, id="curl-user"),
    pytest.param("curl --user 'me:s3cret'", f"curl --user 'me:{R}'", 1, id="curl-user-long"),
    pytest.param("docker run -u 1000:1000 img", "docker run -u 1000:1000 img", 0, id="docker-uid"),
    pytest.param("sshpass -p s3cretpw ssh h", f"sshpass -p {R} ssh h", 1, id="sshpass"),
    pytest.param("mysql -u root -ps3cretpw db", f"mysql -u root -p{R} db", 1, id="mysql-p"),
    pytest.param("<Password>a b</Password>", f"<Password>{R}</Password>", 1, id="xml-element"),
    pytest.param("<ns:ApiKey>k1</ns:ApiKey>", f"<ns:ApiKey>{R}</ns:ApiKey>", 1, id="xml-ns"),
    pytest.param("<author>me</author>", "<author>me</author>", 0, id="xml-not-auth"),
    pytest.param("  password q1w2e3r4\n", f"  password {R}\n", 1, id="netrc-password-line"),
    pytest.param("username and password keys.", "username and password keys.", 0, id="prose"),
    pytest.param(
        "> Cookie: theme=dark; session=abc123\n< set-cookie: sid=xyz; Path=/\n",
        f"> Cookie: {R}\n< set-cookie: {R}\n",
        2,
        id="cookies",
    ),
    pytest.param(
        f"---- BEGIN SSH2 ENCRYPTED PRIVATE KEY ----\nComment: x\nP2/56w{run(40)}\n"
        "---- END SSH2 ENCRYPTED PRIVATE KEY ----\nafter",
        f"{R}\nafter",
        1,
        id="ssh2-private-key",
    ),
    pytest.param(
        f"PuTTY-User-Key-File-3: ssh-ed25519\nPublic-Lines: 1\nAAAAC3Nz\n"
        f"Private-Lines: 1\nAAAAIF{run(40)}\nPrivate-MAC: {HEX}",
        f"PuTTY-User-Key-File-3: ssh-ed25519\nPublic-Lines: 1\nAAAAC3Nz\n"
        f"Private-Lines: 1\n{R}\nPrivate-MAC: {HEX}",
        1,
        id="putty-private-key",
    ),
    # Placement.
    pytest.param(f"{OPENAI}", R, 1, id="whole-text"),
    pytest.param(f"{NPM} at start", f"{R} at start", 1, id="start-of-text"),
    pytest.param(f"at end {GITLAB}", f"at end {R}", 1, id="end-of-text"),
    pytest.param(
        f"a={GOOGLE_KEY} b={TWILIO} c={GITLAB}", f"a={R} b={R} c={R}", 3, id="several-per-line"
    ),
    pytest.param(
        json.dumps({"log": f"pushed with {OPENAI} and {AWS_KEY_ID}"}),
        f'{{"log": "pushed with {R} and {R}"}}',
        2,
        id="inside-json-string",
    ),
    pytest.param(
        f"line one\n  ... very long line {'x' * 500} {SENDGRID} {'y' * 500}\nline three",
        f"line one\n  ... very long line {'x' * 500} {R} {'y' * 500}\nline three",
        1,
        id="inside-long-line",
    ),
    pytest.param(
        f"OPENAI_API_KEY={OPENAI}", f"OPENAI_API_KEY={R}", 1, id="two-rules-one-redaction"
    ),
]


@pytest.mark.parametrize(("text", "expected", "count"), ROWS)
def test_format(text: str, expected: str, count: int) -> None:
    assert SCRUBBER.scrub(text) == (expected, count)


@pytest.mark.parametrize(("text", "expected", "count"), ROWS)
def test_scrubbing_twice_changes_nothing(text: str, expected: str, count: int) -> None:
    assert SCRUBBER.scrub(SCRUBBER.scrub(text)[0]) == (expected, 0)


# Configured literal secrets

SECRET = 's3cr3t/with? ~value>>"'  # base64 with + / and padding; a space, / and " to encode


def forms(secret: str) -> list[tuple[str, str]]:
    raw = secret.encode()
    std, url = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
    return [
        ("plain", secret),
        ("base64", std),
        ("base64-unpadded", std.rstrip("=")),
        ("base64-urlsafe", url),
        ("base64-urlsafe-unpadded", url.rstrip("=")),
        ("quote", quote(secret)),
        ("quote-safe-none", quote(secret, safe="")),
        ("quote-plus", quote_plus(secret)),
        ("json", json.dumps(secret)[1:-1]),
    ]


def test_encoded_forms_differ() -> None:
    """Each row below tests something of its own."""
    encoded = dict(forms(SECRET))
    assert len(set(encoded.values())) == len(encoded)
    assert encoded["base64"].endswith("=")
    assert {"+", "/"} <= set(encoded["base64"])


@pytest.mark.parametrize(
    ("form", "encoded"), forms(SECRET), ids=[name for name, _ in forms(SECRET)]
)
def test_literal_secret_forms(form: str, encoded: str) -> None:
    scrubber = Scrubber([SECRET])
    assert scrubber.scrub(f"before {encoded} after") == (f"before {R} after", 1)
    assert scrubber.scrub(f"x{encoded}y") == (f"x{R}y", 1)  # inside a longer word


LITERAL_ROWS = [
    pytest.param(
        ["a.b*c+d?(e)[f]{g}|^$\\"], "1a.b*c+d?(e)[f]{g}|^$\\2", f"1{R}2", 1, id="regex-chars"
    ),
    pytest.param(["a.b*c+d?(e)"], "aXb*c+d?(e)", "aXb*c+d?(e)", 0, id="metachars-are-literal"),
    pytest.param(["abcdefgh12"], "abcdefgh12 abcdefgh12", f"{R} {R}", 2, id="twice"),
    pytest.param(["abcdefgh", "abcdefghijkl"], "abcdefghijkl", R, 1, id="one-inside-another"),
    pytest.param(["abcdefgh", "efghijkl"], "_abcdefghijkl_", f"_{R}_", 1, id="overlapping"),
    pytest.param(["aaaaaaaa"], "aaaaaaaaaaa", R, 1, id="overlapping-itself"),
    pytest.param(["abcdefgh", "ijklmnop"], "abcdefghijklmnop", f"{R}{R}", 2, id="adjacent"),
    pytest.param(["pässwörd-ü"], "x pässwörd-ü y", f"x {R} y", 1, id="non-ascii"),
    pytest.param(["pässwörd-ü"], quote("pässwörd-ü"), R, 1, id="non-ascii-url-encoded"),
    pytest.param(
        ['quo"te\\back'], json.dumps({"v": 'quo"te\\back'}), f'{{"v": "{R}"}}', 1, id="json"
    ),
    pytest.param(["abcdefgh"], "ABCDEFGH", "ABCDEFGH", 0, id="case-sensitive"),
]


@pytest.mark.parametrize(("secrets", "text", "expected", "count"), LITERAL_ROWS)
def test_literal_secrets(secrets: list[str], text: str, expected: str, count: int) -> None:
    assert Scrubber(secrets).scrub(text) == (expected, count)


def test_literal_and_pattern_together() -> None:
    scrubber = Scrubber(["hunter2hunter2"])
    text = f"password=hunter2hunter2 then {NPM} then hunter2hunter2"
    assert scrubber.scrub(text) == (f"password={R} then {R} then {R}", 3)


def test_many_secrets() -> None:
    secrets = [f"secret-number-{i:03d}" for i in range(100)]
    scrubber = Scrubber(secrets)
    text = " ".join(secrets[::7])
    assert scrubber.scrub(text) == (" ".join([R] * len(secrets[::7])), len(secrets[::7]))


def test_scrub_value_recurses_and_sums() -> None:
    scrubber = Scrubber(["hunter2hunter2"])
    value = {
        "hunter2hunter2": ["hunter2hunter2", ("x", f"token={run(10)}"), 3, None],
        "nested": {"deep": [{"s": "hunter2hunter2 and hunter2hunter2"}]},
        "plain": "nothing here",
        "number": 1.5,
    }
    cleaned, count = scrubber.scrub_value(value)
    assert cleaned == {
        "hunter2hunter2": [R, ("x", f"token={R}"), 3, None],  # keys are left alone
        "nested": {"deep": [{"s": f"{R} and {R}"}]},
        "plain": "nothing here",
        "number": 1.5,
    }
    assert count == 4
    assert isinstance(cleaned, dict)
    assert isinstance(cleaned["hunter2hunter2"][1], tuple)
    assert value["nested"] == {"deep": [{"s": "hunter2hunter2 and hunter2hunter2"}]}  # not mutated


@pytest.mark.parametrize(
    "value", [42, None, b"token=abc", {"a": ["clean", ("text",)]}, ["x"]], ids=repr
)
def test_scrub_value_without_secrets_returns_value_itself(value: object) -> None:
    cleaned, count = SCRUBBER.scrub_value(value)
    assert cleaned is value
    assert count == 0


@pytest.mark.parametrize(
    ("secrets", "kwargs", "message"),
    [
        pytest.param(["long-enough", "short"], {}, "secret #2 has 5 characters", id="too-short"),
        pytest.param([""], {}, "secret #1 has 0 characters", id="empty"),
        pytest.param(["abcd"], {"min_secret_length": 5}, "at least 5", id="custom-minimum"),
        pytest.param(["abcd"], {"min_secret_length": 0}, "min_secret_length", id="minimum-zero"),
        pytest.param("a-long-string", {}, "not one string", id="one-string"),
        pytest.param([12345678], {}, "secret #1 is a int", id="not-a-string"),
    ],
)
def test_bad_secrets_raise(secrets: object, kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Scrubber(secrets, **kwargs)  # type: ignore[arg-type]
    given = secrets if isinstance(secrets, list) else [secrets]
    assert [s for s in given if isinstance(s, str) and s and s in str(info.value)] == []


def test_short_secret_allowed_by_lower_minimum() -> None:
    assert Scrubber(["abcd"], min_secret_length=4).scrub("x abcd y") == (f"x {R} y", 1)


# Ordinary output stays as it is

ORDINARY = "\n".join(
    [
        "$ ls -la",
        "total 48",
        "drwxr-xr-x  5 dev dev  4096 Mar  3 12:01 .",
        "-rw-r--r--  1 dev dev  1532 Mar  3 12:01 pyproject.toml",
        "-rw-------  1 dev dev   312 Mar  3 12:01 token.txt",
        "lrwxrwxrwx  1 dev dev    24 Mar  3 12:01 secrets -> /run/secrets/app",
        "$ git log --oneline -4",
        "3f2a9c1 Fix token bucket refill when the rate changes",
        "b7e4d02 Merge pull request #12 from dev/task-list-desk-lamp",
        "9c0ffee auth: fix the login redirect",
        "e83c5b2 Rotate the password hashing cost; the password is never logged",
        "$ git rev-parse HEAD",
        "3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a39",
        "$ pip install -r requirements.txt",
        "Collecting requests>=2.31 (from -r requirements.txt (line 3))",
        "  Downloading requests-2.31.0-py3-none-any.whl (62 kB)",
        "Requirement already satisfied: tokenizers in ./.venv/lib/python3.11/site-packages",
        "  Created wheel for app: filename=app-1.0-py3-none-any.whl size=4321 "
        "sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "Successfully installed certifi-2024.2.2 google-auth-2.29.0 idna-3.6",
        "npm WARN deprecated inflight@1.0.6: This module is not supported",
        "npm http fetch GET 200 https://registry.npmjs.org/js-tokens 5ms (cache hit)",
        "added 120 packages, and audited 121 packages in 3s",
        "$ ps aux",
        "USER       PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND",
        "root         1  0.0  0.1 168000 11000 ?        Ss   09:00   0:02 /sbin/init",
        "dev       4242  1.2  2.3 912000 190000 pts/0   Sl+  09:14   0:10 python -m pytest -x",
        "dev       4250  0.0  0.0  10000  1000 pts/1    S    09:15   0:00 ssh -o "
        "PasswordAuthentication=no git@github.com",
        "$ python app.py",
        "Traceback (most recent call last):",
        '  File "/home/dev/app/auth.py", line 12, in get_token',
        "    token = session.fetch_token(url, client_id=CLIENT_ID)",
        '    password = os.environ["DB_PASSWORD"]',
        '  File "/usr/lib/python3.11/json/decoder.py", line 355, in raw_decode',
        "KeyError: 'token'",
        "def login(user: str, password: str, token: str | None = None) -> Session:",
        "    api_key: Optional[str] = None",
        '    export GITHUB_TOKEN=$GH_TOKEN; curl -H "Authorization: Bearer ${TOKEN}"',
        "PWD=/home/dev/app",
        "OLDPWD=/home/dev",
        "SSH_AUTH_SOCK=/run/user/1000/keyring/ssh",
        "XAUTHORITY=/home/dev/.Xauthority",
        "$ cat /etc/os-release",
        'PRETTY_NAME="Ubuntu 22.04.4 LTS"',
        'NAME="Ubuntu"',
        'VERSION_ID="22.04"',
        "ID=ubuntu",
        'HOME_URL="https://www.ubuntu.com/"',
        'PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"',
        "$ cat package-lock.json",
        '      "resolved": "https://registry.npmjs.org/lodash/-/lodash-4.17.21.tgz",',
        '      "integrity": "sha512-v2kDEe57lecTulaDIuNTPy3Ry4gLGJ6Z1O3vE1krgXZNrsQ+LFTGHVxVjcXPs'
        '17LhbZVGedAJv8XZ1tvj5FvSg=="',
        "sha256:4bc453b53cb3d914b45f4b250294236adba2c0e09ff6f03793949e7e39fd4cc1",
        '    hash = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"',
        "request 9b2f1c4e-7a3d-4e8b-a1c2-3d4e5f6a7b8c and 123e4567-e89b-12d3-a456-426614174000",
        "short shas: 3f2a9c1 b7e4d02; md5 d41d8cd98f00b204e9800998ecf8427e",
        "SGVsbG8sIHdvcmxkISBUaGlzIGlzIG9yZGluYXJ5IGJhc2U2NCBkYXRhLg==",
        "eyJhcGlWZXJzaW9uIjoidjEiLCJraW5kIjoiQ29uZmlnTWFwIn0=",
        "AKIA is the prefix of an access key id; AKIAshort is not one",
        "the token bucket refills; reset your password in settings; token, secret, password.",
        "Access-Control-Allow-Headers: Authorization, Content-Type",
        "touch: cannot touch '/etc/passwd': Read-only file system",
        "sed: couldn't open temporary file /etc/passwd: Read-only file system",
        "grep: /root/.token: Permission denied",
        "Authorization:",
        "see https://example.com/docs?page=2 and ssh://git@github.com/o/r.git",
        "write to jane.doe+filter@example.co.uk or git@github.com:org/repo.git",
        "sk- prefixed: task-list desk-lamp risk-free sk-learn",
        "pk_live_" + run(24) + " is a publishable key",
        "Twilio account AC" + HEX * 2,
        "passwd: password updated successfully",
        "PASS: tests/test_login.py",
        "max_tokens: 1024, prompt_tokens: 12, token_type: bearer",
        "SELECT * FROM users WHERE token_hash = 'x' AND created > now() - interval '1 day';",
        "12:01:33 INFO server: listening on 0.0.0.0:8080",
        "if token == other_token: token != None",
        "    def get(self, secret_id: str) -> Secret:  # pylint: disable=arguments-differ",
        "    self.key_password = key_password; f(auth=self.auth, token=token)",
        "    sig = inspect.signature(fn); special_sig=special_sig",
        "    :param token: The token to refresh, if any.",
        "Authorization: Bearer",
        "pip: use the --password option, or --token for the upload token",
        "api_key: ${API_KEY}",
    ]
)


def test_ordinary_output_is_unchanged() -> None:
    text, count = Scrubber(["not-in-the-text-at-all"]).scrub(ORDINARY)
    assert [line for line in text.splitlines() if line not in ORDINARY.splitlines()] == []
    assert (text, count) == (ORDINARY, 0)


# Hostile input: linear time, no catastrophic backtracking


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "count"),
    [
        pytest.param("a" * 10_000_000, 0, id="10MB-of-a"),
        pytest.param("sk-" * 1_000_000, 0, id="sk-repeated"),
        pytest.param(("sk-" + "a" * 19 + " ") * 200_000, 0, id="sk-near-misses"),
        pytest.param("eyJ" + "a" * 1_000_000 + ".", 0, id="jwt-without-dots"),
        pytest.param(("eyJaaaaaaaaaa.x." * 300_000), 0, id="jwt-near-misses"),
        pytest.param("password=" * 500_000, 1, id="password-equals-repeated"),
        pytest.param("token: " * 500_000, 0, id="token-colon-repeated"),
        pytest.param("-----BEGIN RSA PRIVATE KEY-----\n" * 100_000, 100_000, id="pem-begins"),
        pytest.param("://a:" * 500_000 + "b", 0, id="url-near-misses"),
        pytest.param("://u:" + "p@" * 500_000, 1, id="url-many-at-signs"),
        pytest.param("--" + "a-" * 1_000_000, 0, id="cli-flag-one-long-name"),
        pytest.param("login.x " * 500_000, 0, id="netrc-near-misses"),
        pytest.param("Bearer " * 500_000, 0, id="bearer-repeated"),
        pytest.param("mysql " * 300_000, 0, id="mysql-repeated"),
        pytest.param("mysql -u a " * 100_000, 0, id="mysql-options-repeated"),
        pytest.param("</password>" * 200_000, 0, id="xml-close-repeated"),
        pytest.param("-u 1:1 " * 300_000, 0, id="docker-user-repeated"),
        pytest.param("8Q~" * 500_000, 38_461, id="azure-ad-prefix-repeated"),
        pytest.param("Private-Lines: 1\n" * 100_000, 0, id="putty-lines-repeated"),
        pytest.param("1:AA" * 500_000, 0, id="telegram-prefix-repeated"),
        pytest.param(("QUFBQUFBQUFB" * 4 + "\n") * 40_000, 0, id="b64-lines"),
        pytest.param("\ud800\udfff\x00" * 1_000_000, 0, id="surrogates-and-nul"),
    ],
)
def test_hostile_input(text: str, count: int) -> None:
    cleaned, n = Scrubber(["hostile-secret-value"]).scrub(text)
    assert n == count
    assert len(cleaned) <= len(text) + n * len(R)


def test_odd_characters_around_secrets() -> None:
    scrubber = Scrubber(["hunter2\x00\ud800x"])
    text = f"\x00{NPM}\ud800 hunter2\x00\ud800x \udfff"
    assert scrubber.scrub(text) == (f"\x00{R}\ud800 {R} \udfff", 2)


# Configured secrets inside longer encoded output

EMBEDDED = "pa$$:w0rd/+~é!*(x)&<"  # URL-, JSON- and HTML-special characters, one non-ASCII


def _wrapped(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


@pytest.mark.parametrize("wrap", [0, 76, 64], ids=["one-line", "wrap-76", "wrap-64"])
@pytest.mark.parametrize("alphabet", ["standard", "urlsafe"])
@pytest.mark.parametrize("before", ["", "K", "KE", "KEY=", "API_TOKEN_X=", "Zz9" * 25 + "#"])
def test_secret_inside_a_longer_base64_stream(before: str, alphabet: str, wrap: int) -> None:
    """`env | base64`: the secret sits at any of the three alignments of a longer stream, so
    its base64 differs from that of the secret alone; `base64` wraps at 76 columns."""
    encode = base64.b64encode if alphabet == "standard" else base64.urlsafe_b64encode
    raw = f"{before}{EMBEDDED}\nOTHER=value\n".encode()
    encoded = encode(raw).decode()
    text = _wrapped(encoded, wrap) if wrap else encoded
    cleaned, count = Scrubber([EMBEDDED]).scrub(text)
    assert count >= 1
    # Every base64 character fully made of the secret's bits is gone: no 8-character run of
    # the secret's own encoding (at any alignment) survives.
    flat = cleaned.replace("\n", "")
    for shift in range(3):
        alone = encode(b"\0" * shift + EMBEDDED.encode()).decode()
        inner = alone[(8 * shift + 5) // 6 : (8 * (shift + len(EMBEDDED.encode()))) // 6]
        assert all(inner[i : i + 8] not in flat for i in range(len(inner) - 7)), shift


def _url_forms(secret: str) -> list[tuple[str, str]]:
    upper = quote(secret, safe="")
    js = quote(secret, safe="!'()*~-_.")  # encodeURIComponent leaves !'()* alone
    return [
        ("lowercase-hex", re.sub("%[0-9A-F]{2}", lambda m: m[0].lower(), upper)),
        ("encodeURIComponent", js),
        ("encodeURI", quote(secret, safe="!#$&'()*+,/:;=?@~")),
        ("plus-for-space", quote_plus(secret + " x").removesuffix("+x")),
    ]


def _json_forms(secret: str) -> list[tuple[str, str]]:
    ascii_json = json.dumps(secret)[1:-1]
    return [
        ("json-slash-escaped", ascii_json.replace("/", "\\/")),  # PHP json_encode
        ("json-uppercase-u", re.sub(r"\\u(....)", lambda m: "\\u" + m[1].upper(), ascii_json)),
        ("json-go-html-escapes", ascii_json.replace("<", "\\u003c").replace("&", "\\u0026")),
        ("json-all-escaped", "".join(f"\\u{ord(c):04x}" if not c.isalnum() else c for c in secret)),
        ("html-entities", html.escape(secret)),
        ("shell-printf-q", re.sub(r"([^A-Za-z0-9_/.,:=@%+-])", r"\\\1", secret)),
    ]


@pytest.mark.parametrize(
    ("form", "encoded"),
    _url_forms(EMBEDDED) + _json_forms(EMBEDDED),
    ids=[name for name, _ in _url_forms(EMBEDDED) + _json_forms(EMBEDDED)],
)
def test_secret_in_other_encoders_forms(form: str, encoded: str) -> None:
    cleaned, count = Scrubber([EMBEDDED]).scrub(f"<{encoded}>")
    assert count == 1, (form, encoded, cleaned)
    assert "w0rd" not in cleaned


@pytest.mark.parametrize("kept", [4, 10, len(SECRET) - 1])
@pytest.mark.parametrize("encode", [str, lambda s: base64.b64encode(s.encode()).decode()])
def test_a_secret_cut_at_the_end_of_a_truncated_output(kept: int, encode: object) -> None:
    encoded = encode(SECRET)  # type: ignore[operator]
    text = f"line one\nvalue: x{encoded}"[: len("line one\nvalue: x") + kept]
    cleaned, count = Scrubber([SECRET]).scrub_cut(text)
    assert cleaned == f"line one\nvalue: x{R}"
    assert count == 1


def test_a_cut_that_ends_in_no_secret_changes_nothing() -> None:
    assert Scrubber([SECRET]).scrub_cut("ordinary text, cut her") == ("ordinary text, cut her", 0)
    assert Scrubber([SECRET]).scrub_cut(f"ends in three: x{SECRET[:3]}")[1] == 0


@pytest.mark.parametrize("secret", ["k9-Zq7!x", "hunter2-Zq7-9fX-s3cr3t", "Zq7-" * 16])
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("width", [40, 64, 76])
def test_wrapped_secret_at_every_offset_and_width(secret: str, newline: str, width: int) -> None:
    """The secret's base64 split by line breaks at every place (a short secret at one break,
    a long one across two with short pieces at both ends) is found all the same."""
    scrubber = Scrubber([secret])
    for offset in range(width + 3):
        raw = ("x" * offset + secret + "\nOTHER=value\n").encode()
        encoded = base64.b64encode(raw).decode()
        text = newline.join(encoded[i : i + width] for i in range(0, len(encoded), width))
        flat = scrubber.scrub(text)[0].replace(newline, "")
        shift = offset % 3
        alone = base64.b64encode(b"\0" * shift + secret.encode()).decode()
        inner = alone[(8 * shift + 5) // 6 : (8 * (shift + len(secret))) // 6]
        assert all(inner[i : i + 8] not in flat for i in range(len(inner) - 7)), offset
