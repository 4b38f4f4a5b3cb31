"""The gpuhost provider plugin: the program's custom resources served by a Pulumi resource provider of its own
(provider/__main__.py), not by `pulumi.dynamic` - no pickled code in state, no four-calls-at-a-time cap, a
schema, and `pulumi import` (Read by id)."""
