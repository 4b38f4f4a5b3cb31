"""Merges the monitoring outputs of several gpuhost stacks (shards of one fleet: a site, a rack) into
one: `prometheus_file_sd` with every shard's targets, each group labelled with its shard.

    pulumi config set --path 'shards[0]' organization/gpuhost/site-a     # as `pulumi stack ls` names them
    pulumi config set --path 'shards[1]' organization/gpuhost/site-b
    pulumi up && pulumi stack output prometheus_file_sd --json > /etc/prometheus/file_sd/gpuhost.json

Run it after the shards' `pulumi up` (docs/fleets.md, "Many hosts: a fleet"). It reads their outputs only; it
changes nothing on any host.
"""

import os
import sys

import pulumi

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from merge import MergeError, merge_file_sd  # noqa: E402

cfg = pulumi.Config()
shards = cfg.require_object('shards')
if not isinstance(shards, list) or not shards or not all(isinstance(s, str) and s.count('/') == 2 for s in shards):
    raise pulumi.RunError('shards: %r is not a list of stack names (organization/gpuhost/<stack>, as `pulumi stack '
                          'ls --all` shows them)' % (shards,))
twice = sorted({s for s in shards if shards.count(s) > 1})
if twice:
    raise pulumi.RunError('shards: %s is listed twice; each shard once (its hosts would be counted twice)' % twice[0])
refs = {name: pulumi.StackReference(name) for name in shards}


def merged(outputs):
    try:
        return merge_file_sd(dict(zip(shards, outputs)))
    except MergeError as e:
        raise pulumi.RunError(str(e)) from None


groups = pulumi.Output.all(*[refs[n].require_output('prometheus_file_sd') for n in shards]).apply(merged)
pulumi.export('prometheus_file_sd', groups)
pulumi.export('shards', shards)
