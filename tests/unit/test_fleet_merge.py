"""fleet-monitoring/merge.py: shards' file_sd into one, labelled by shard; a host in two shards refused."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', 'fleet-monitoring'))
from merge import MergeError, merge_file_sd  # noqa: E402


def group(target, host=None, node='pve-a'):
    labels = {'id': 'lxc/200', 'node': node}
    if host:
        labels['host'] = host
    return {'targets': [target], 'labels': labels}


def test_groups_keep_their_host_and_gain_their_shard():
    out = merge_file_sd({'organization/gpuhost/site-a': [group('10.0.0.4:30000', 'gpu01')],
                         'organization/gpuhost/site-b': [group('10.1.0.4:30000', node='pve-b')]})
    assert [g['labels'] for g in out] == [
        {'id': 'lxc/200', 'node': 'pve-a', 'host': 'gpu01', 'shard': 'site-a'},
        {'id': 'lxc/200', 'node': 'pve-b', 'host': 'pve-b', 'shard': 'site-b'}]


def test_a_host_in_two_shards_is_refused():
    with pytest.raises(MergeError, match='10.0.0.4:30000 is in shard site-a and in shard site-b'):
        merge_file_sd({'o/p/site-a': [group('10.0.0.4:30000')], 'o/p/site-b': [group('10.0.0.4:30000')]})
