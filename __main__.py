import pulumi
from pulumi.dynamic import Resource, ResourceProvider, CreateResult

class P(ResourceProvider):
    def create(self, props):
        import sys
        return CreateResult("id1", {"py": sys.executable, **props})

class R(Resource):
    py: pulumi.Output[str]
    def __init__(self, name, opts=None):
        super().__init__(P(), name, {"py": None, "x": 1}, opts)

r = R("r")
pulumi.export("py", r.py)
