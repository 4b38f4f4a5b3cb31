"""Merging file_sd target groups of several gpuhost stacks (pure, unit-tested)."""


class MergeError(ValueError):
    pass


def merge_file_sd(shards: dict) -> list:
    """{stack name: its prometheus_file_sd} -> one list; each group gets a `shard` label (the stack's
    name without organization/project) and keeps its `host` label (a one-host stack's groups get
    their node as host). A target in two shards means two stacks manage one host: refused."""
    out, seen = [], {}
    for name, groups in shards.items():
        shard = name.rsplit('/', 1)[-1]
        for group in groups or []:
            labels = dict(group.get('labels') or {})
            labels.setdefault('host', labels.get('node', shard))
            labels['shard'] = shard
            for target in group.get('targets') or []:
                if target in seen and seen[target] != shard:
                    raise MergeError('target %s is in shard %s and in shard %s: one host is managed by two stacks - '
                                     'remove it from one of them' % (target, seen[target], shard))
                seen[target] = shard
            out.append({'targets': list(group.get('targets') or []), 'labels': labels})
    return out
