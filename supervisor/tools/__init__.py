"""The tool vocabulary: the catalog of tools, their schemas for each provider, argument
validation and the renderings of results. Read by policy, audit and the call path alike;
imports nothing above config."""
