# A thin wrapper around CMake: the two commands a newcomer needs.
#   make demo    install missing dependencies, build, run the main job (the
#                2-rank latency/bandwidth sweep of tern-perf)
#   make check   build and run the whole CTest suite
# BUILD=dir picks the build directory; SANITIZE=address,undefined or thread
# builds with sanitizers; CTEST_FLAGS passes options to ctest (e.g. -L core).

BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=
SANITIZE ?=

ifneq ($(SANITIZE),)
CMAKE_FLAGS += -DTERN_SANITIZE=$(SANITIZE)
endif

# Tests and the demo run on one machine: keep UCX on loopback (its default
# would also use the machine's other interfaces). A caller's setting wins.
export UCX_NET_DEVICES ?= lo

.PHONY: all deps configure build demo check install clean

all: build

deps:
	@ci/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job: a 2-rank latency and bandwidth sweep over the default
# transport, then the RPC profiling recipe (examples/rpc_profile.c): its
# tables, and a chrome trace in $(BUILD)/trace.json.
demo: build
	$(BUILD)/tools/tern-run -n 2 --no-prefix --timeout 5m $(BUILD)/perf/tern-perf lat --max-size 1M
	$(BUILD)/tools/tern-run -n 2 --no-prefix --timeout 5m $(BUILD)/perf/tern-perf bw --min-size 1k --max-size 4M
	$(BUILD)/tools/tern-run -n 2 --no-prefix --timeout 2m $(BUILD)/examples/tern-rpc-profile $(BUILD)/trace.json $(BUILD)/trace_job.json

check: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

clean:
	rm -rf $(BUILD)
