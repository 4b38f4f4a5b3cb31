"""resources/resource.py: a serving class that leaves a call out behaves as the dynamic provider it was before the
plugin did - what the engine then sees for it is unchanged."""

import pytest

from resources.resource import CheckResult, DiffResult, ReadResult, ResourceProvider, UpdateResult, dynamic_type, \
    token


def test_a_class_that_leaves_a_call_out_gets_the_dynamic_providers_default():
    p, olds, news = ResourceProvider(), {'path': '/etc/a'}, {'path': '/etc/b'}
    assert p.check(olds, news) == CheckResult(news, [])          # taken as they are, nothing refused
    assert p.diff('id', olds, news) == DiffResult(None, None, None)   # the engine decides (it compares the inputs)
    assert p.read('id', olds) == ReadResult('id', olds, None)      # the properties handed back, inputs as they were
    assert p.update('id', olds, news) == UpdateResult(None)
    assert p.delete('id', olds) is None
    with pytest.raises(NotImplementedError, match='ResourceProvider serves no create'):
        p.create(news)


def test_a_type_is_named_as_the_plugin_serves_it_and_as_the_dynamic_resource_it_was():
    assert token('HostFile') == 'gpuhost:index:HostFile'
    assert dynamic_type('HostFile') == 'pulumi-python:dynamic/gpuhost:HostFile'
