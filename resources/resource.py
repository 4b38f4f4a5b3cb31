"""What a custom resource of this project is, for the gpuhost provider plugin that serves it (provider/__main__.py):
its type token, a base class with the six calls the plugin makes - check, diff, create, read, update, delete - and
the results each returns. The plugin turns the results into the engine's gRPC responses; nothing here knows gRPC.

Standard library only: the plugin (provider/) imports this, the program's components import this, and this imports
neither.

The calls' defaults are those of the dynamic providers the resources were before the plugin (pulumi.dynamic's
ResourceProvider), so a class that leaves one out behaves as it did: check accepts the inputs as they are, diff
leaves the decision to the engine, read hands the properties back, update changes nothing, delete forgets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

PACKAGE = 'gpuhost'
# The type each resource had as a dynamic resource, before the plugin (release 0.1.0): the alias that moves a stack
# deployed then onto the plugin without replacing anything (resources/state.py GpuhostResource).
DYNAMIC_PREFIX = 'pulumi-python:dynamic/gpuhost:'


def token(name: str) -> str:
    """The resource's type token: gpuhost:index:<Name>."""
    return '%s:index:%s' % (PACKAGE, name)


def dynamic_type(name: str) -> str:
    """The type the resource had as a dynamic resource: pulumi-python:dynamic/gpuhost:<Name>."""
    return DYNAMIC_PREFIX + name


@dataclass
class CheckFailure:
    """An input refused at check: the property's name and why."""
    property: str
    reason: str


@dataclass
class CheckResult:
    """The inputs as the resource takes them (the plugin hands these, not the program's, to diff, create and
    update), and the inputs it refuses."""
    inputs: dict
    failures: list = field(default_factory=list)


@dataclass
class DiffResult:
    """changes: True, False, or None for "the engine decides" (it compares the inputs); replaces: the keys whose
    change means a new resource; delete_before_replace: the old one goes first (None: the engine's default)."""
    changes: Optional[bool] = None
    replaces: Optional[list] = None
    delete_before_replace: Optional[bool] = None


@dataclass
class CreateResult:
    id: str
    outs: Optional[dict] = None


@dataclass
class ReadResult:
    """outs: the resource's outputs now; inputs: its inputs after the read (None: as they were)."""
    id: Optional[str] = None
    outs: Optional[dict] = None
    inputs: Optional[dict] = None


@dataclass
class UpdateResult:
    outs: Optional[dict] = None


class ResourceProvider:
    """Base of every class that serves a resource type (provider/registry.py maps each type to one). The plugin
    keeps one instance of a class for every call (stateless: what a call needs comes in its properties), and hands
    each call plain properties - secrets unwrapped, the host's connection and login added."""

    def check(self, olds: dict, news: dict) -> CheckResult:
        return CheckResult(news, [])

    def diff(self, id_: str, olds: dict, news: dict) -> DiffResult:
        return DiffResult()

    def create(self, props: dict) -> CreateResult:
        raise NotImplementedError('%s serves no create' % type(self).__name__)

    def read(self, id_: str, props: dict) -> ReadResult:
        return ReadResult(id_, props)

    def update(self, id_: str, olds: dict, news: dict) -> UpdateResult:
        return UpdateResult()

    def delete(self, id_: str, props: dict) -> None:
        pass

