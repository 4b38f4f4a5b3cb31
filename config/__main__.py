"""python -m config schema | stack-schema: the model's JSON schema, or Pulumi.<stack>.yaml's."""

import json
import sys

from config.deployment import Deployment
from config.schema import stack_schema

if sys.argv[1:] == ['schema']:
    print(json.dumps(Deployment.model_json_schema(), indent=2))
elif sys.argv[1:] == ['stack-schema']:
    print(json.dumps(stack_schema(), indent=2))
else:
    sys.exit('usage: python -m config schema | stack-schema')
