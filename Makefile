# gpuhost - see README.md. Every target sets itself up (tools/bootstrap.sh is idempotent).
STACK ?= lab
OUT ?= render/$(STACK)
MON_OUT ?= monitoring/$(STACK)
SHELL := /bin/bash

.PHONY: up check test test-fast lab lab-down preview fleet-preview fleet-up render monitoring docs lock bench bench-fleet bench-state bench-serve bootstrap clean

up:            ## `pulumi up --refresh` STACK with the policy pack, print its outputs; STACK=lab (default) starts the lab first (FLEET=N: N hosts); ARGS=more flags
	@$(if $(FLEET),tools/run.sh up-fleet $(FLEET),tools/run.sh up $(STACK) $(ARGS))

check:         ## read-only: every prerequisite of STACK's hosts with ✓/✗ and the fix (exit 1 if one is missing; STACK=lab starts the lab)
	@tools/run.sh check $(STACK)

test:          ## the whole test suite (unit, component, integration against the lab)
	@tools/run.sh test

test-fast:     ## the suite without the slow scenarios (marked `slow`)
	@tools/run.sh test -m 'not slow'

lab:           ## start the lab (simulated host + fakepve) unless running; HOSTS=N: a fleet lab of N hosts
	@tools/run.sh lab $(HOSTS)

lab-down:      ## stop the lab (and the fleet lab) and wipe its state
	@tools/run.sh lab-down

preview:       ## pulumi preview --diff of STACK with the policy pack, contacting no host (other than lab: PULUMI_CONFIG_PASSPHRASE(_FILE))
	@tools/run.sh preview $(STACK) $(ARGS)

fleet-preview: ## every shard stack's preview at once (Automation API), one merged table: shard, host, what changes, SGLang restarts, reboots, lock group; STACKS='a b' (default: every Pulumi.<stack>.yaml with gpuhost:hosts), PARALLEL=K shards at once (4); exit 1 if a shard failed
	@tools/run.sh fleet preview $(foreach s,$(STACKS),--stack '$(s)') $(if $(PARALLEL),--parallel '$(PARALLEL)')

fleet-up:      ## every shard stack's `up --refresh` at once, as make up does each, after the merged preview and a question (YES=1: none); the table of what was done, each shard's host table; STACKS, PARALLEL as fleet-preview
	@tools/run.sh fleet up $(foreach s,$(STACKS),--stack '$(s)') $(if $(PARALLEL),--parallel '$(PARALLEL)') $(if $(YES),--yes)

render:        ## write every file STACK would put on its hosts into OUT, contacting nothing
	@tools/run.sh render $(STACK) $(OUT)

monitoring:    ## Prometheus rules, Grafana dashboard and scrape config of STACK into MON_OUT (monitoring/STACK)
	@tools/bootstrap.sh && . ./.env.sh && python -m tools.monitoring $(STACK) $(MON_OUT)

lock:          ## resolve STACK's runtime/sglang.in into its lock (gpuhost:runtime.python.lock) with uv, for its container's Python and glibc, from its index (INDEX=url instead; UPGRADE=1: newest allowed)
	$(if $(filter command line environment,$(origin STACK)),,$(error make lock needs the stack: make lock STACK=prod))
	@tools/bootstrap.sh && . ./.env.sh && python -m tools.lock '$(STACK)' $(if $(INDEX),--index '$(INDEX)') $(if $(UPGRADE),--upgrade)

docs:          ## rewrite what is generated from the code: docs/monitoring.md's outputs tables, docs/configuration.md's table of every key, docs/config.schema.json, docs/stack.schema.json, provider/schema.json (unit tests compare them)
	@tools/bootstrap.sh && . ./.env.sh && python -m tools.docs

bench:         ## no-op preview/up wall time and remote command count on the lab (its section of docs/bench.md)
	@tools/run.sh bench

bench-fleet:   ## fleet benchmark on the lab: no-op preview/up/refresh of 1 and 8 hosts with the operator CPU, a rolling MTP change (docs/bench.md; <= 15 min)
	@tools/run.sh bench-fleet

bench-state:   ## the engine's cost per step as the state grows: synthetic stacks of 8-400 hosts on the file backend (docs/bench.md; BENCH_STATE_HOSTS=8,40,...; ~10-15 min)
	@tools/run.sh bench-state

bench-serve:   ## load-test STACK's endpoint with AIPerf (VARIANTS=off,nextn1,... applies each, then restores; ARGS=more flags)
	@tools/run.sh bench-serve $(STACK) $(if $(VARIANTS),--variants $(VARIANTS)) $(ARGS)

bootstrap:
	@tools/bootstrap.sh

clean: lab-down  ## stop the lab; remove .venv, .pulumi-home, render/ and the lab stacks' state (other stacks' state in .state stays)
	@tools/clean.sh
