# engines/llama: llama.cpp's static libraries, built once into the cache, and the engine.
#
#   make -C engines all                    the CPU engine (fetches + builds llama.cpp the first time)
#   make -C engines all CUDA=1             the CUDA backend (GPU machine; needs nvcc, cuBLAS)
#   make -C engines all LLAMA_PATCHES=none the engine on stock llama.cpp, no patch applied:
#                                          bin/serveproto-llama-stock, its own llama.cpp build
#   make -C engines llama-src DEST=DIR     copy the llama.cpp source subset to DIR (to carry it to a
#                                          machine without network, then build there with
#                                          LLAMA_SRC=DIR)
#   make -C engines llama-libs             only llama.cpp's libraries
#   make -C engines llama-server [CUDA=1]  stock llama-server from the same sdist (the benchmarks' peer)
#
# llama.cpp comes from the PyPI sdist of llama-cpp-python (it vendors llama.cpp); no llama.cpp
# source is committed. The sdist, the extracted subset and each build live in
# $(SERVEPROTO_CACHE)/llama.cpp/<version>/, so a relink of the engine never rebuilds llama.cpp.

LLAMA_PY_VERSION := 0.3.36
SERVEPROTO_CACHE ?= $(HOME)/.cache/serveproto
LLAMA_CACHE  := $(SERVEPROTO_CACHE)/llama.cpp/$(LLAMA_PY_VERSION)
LLAMA_SDIST  := $(LLAMA_CACHE)/sdist/llama_cpp_python-$(LLAMA_PY_VERSION).tar.gz
LLAMA_SUBSET := CMakeLists.txt cmake ggml src include vendor LICENSE
# Our patches to llama.cpp and ggml (llama/patches/README.md; spec/llama-engine.md "Reproducible digits"), by
# group, in this order, applied to a copy of the pristine subset named after their hash, so a changed patch gets
# its own source and build. LLAMA_PATCHES=none: none of them (the stock build, bin/serveproto-llama-stock).
LLAMA_PATCHES       ?= all
LLAMA_PATCH_GROUPS  := numerics speed api profile
ifeq ($(LLAMA_PATCHES),all)
LLAMA_PATCH_FILES   := $(foreach g,$(LLAMA_PATCH_GROUPS),$(sort $(wildcard llama/patches/$(g)/*.patch)))
LLAMA_STOCK         :=
else ifeq ($(LLAMA_PATCHES),none)
LLAMA_PATCH_FILES   :=
LLAMA_STOCK         := -stock
else
$(error LLAMA_PATCHES=$(LLAMA_PATCHES): all (the default) or none)
endif
LLAMA_PATCH_ID := $(shell cat $(LLAMA_PATCH_FILES) /dev/null | sha256sum | cut -c1-10)
LLAMA_PRISTINE := $(LLAMA_CACHE)/src
LLAMA_PATCHED  := $(LLAMA_CACHE)/src-$(LLAMA_PATCH_ID)
# llama.cpp's RPC server source (tools/rpc), extracted beside the subset (ggml-rpc-server, below)
LLAMA_RPC_TOOL := $(LLAMA_CACHE)/tools-rpc
# The patched source (the pristine one for the stock build); override with a carried copy
# (LLAMA_SRC=.llama-src) where there is no network.
LLAMA_SRC_OWN := $(if $(LLAMA_STOCK),$(LLAMA_PRISTINE),$(LLAMA_PATCHED))
LLAMA_SRC    ?= $(LLAMA_SRC_OWN)
LLAMA_JOBS   ?= 2
# Python with pip, to fetch the sdist (the project venv when it exists).
LLAMA_PIP_PY ?= $(shell test -x ../.venv/bin/python && echo ../.venv/bin/python || echo python3)

# GGML_RPC: llama.cpp's RPC backend (`--rpc host:port,...` places layers on ggml-rpc-servers,
# spec/llama-engine.md "Several devices"); its RDMA transport off (libibverbs would be a link
# dependency where it is found).
LLAMA_CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMON=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF \
  -DGGML_RPC=ON -DGGML_RPC_RDMA=OFF

ifeq ($(CUDA),1)
LLAMA_VARIANT     := cuda$(LLAMA_STOCK)
# one GPU per engine: no NCCL (it would add a link dependency)
LLAMA_CMAKE_FLAGS += -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DCMAKE_CUDA_ARCHITECTURES=$(or $(CUDA_ARCH),90)
# ggml-cuda's archive, relative to the build directory (also a ninja target's name there)
LLAMA_CUDA_LIB    := ggml/src/ggml-cuda/libggml-cuda.a
LLAMA_EXTRA_LIBS  := $(LLAMA_CUDA_LIB)
LLAMA_CUDA_HOME   := $(or $(CUDA_HOME),/usr/local/cuda)
# libcuda comes with the driver; the toolkit's stub satisfies the link.
LLAMA_SYS_LIBS    := -L$(LLAMA_CUDA_HOME)/lib64 -L$(LLAMA_CUDA_HOME)/lib64/stubs \
  -lcudart -lcublas -lcublasLt -lcuda -ldl -lrt
else
LLAMA_VARIANT     := cpu$(LLAMA_STOCK)
LLAMA_EXTRA_LIBS  :=
LLAMA_SYS_LIBS    :=
endif

# A build is named after the patches and the CMake flags: a changed flag gets its own directory, so
# checkouts sharing the cache never link one another's builds.
LLAMA_BUILD_ID := $(shell { cat $(LLAMA_PATCH_FILES) /dev/null; echo '$(LLAMA_CMAKE_FLAGS)'; } | sha256sum | cut -c1-10)
LLAMA_BUILD := $(LLAMA_CACHE)/build-$(LLAMA_VARIANT)-$(LLAMA_BUILD_ID)
# Link order: llama, ggml (the backend registry), the backends, ggml-base.
LLAMA_GGML_LIBS := $(LLAMA_BUILD)/ggml/src/libggml.a $(LLAMA_BUILD)/ggml/src/ggml-rpc/libggml-rpc.a \
  $(addprefix $(LLAMA_BUILD)/,$(LLAMA_EXTRA_LIBS)) $(LLAMA_BUILD)/ggml/src/libggml-cpu.a \
  $(LLAMA_BUILD)/ggml/src/libggml-base.a
LLAMA_LIBS  := $(LLAMA_BUILD)/src/libllama.a $(LLAMA_GGML_LIBS)
LLAMA_STAMP := $(LLAMA_BUILD)/.serveproto-built
LLAMA_INC   := -I$(LLAMA_SRC)/include -I$(LLAMA_SRC)/ggml/include

include llama/mtmd.mk

LLAMA_ENGINE_SRCS := $(wildcard llama/*.c)
LLAMA_ENGINE_HDRS := $(wildcard llama/*.h)

.PHONY: llama-libs llama-src
ifeq ($(LLAMA_STOCK),)
all: $(BIN)/serveproto-llama $(BIN)/llama-prefill-ref $(BIN)/llama-tokenize-ref $(BIN)/llama-logit-hash $(BIN)/ggml-rpc-server \
  $(BIN)/llama-mtmd-ref
else
all: $(BIN)/serveproto-llama-stock
endif

llama-libs: $(LLAMA_STAMP)

$(LLAMA_SDIST):
	mkdir -p $(dir $@)
	$(LLAMA_PIP_PY) -m pip download -q --no-deps --no-binary :all: \
	  -d $(dir $@) llama-cpp-python==$(LLAMA_PY_VERSION)
	test -f $@

# Only the subset that the C libraries need (36 MB instead of the whole sdist).
$(LLAMA_PRISTINE)/.extracted: | $(LLAMA_SDIST)
	t=$$(mktemp -d $(LLAMA_PRISTINE).tmp.XXXXXX) && tar -xzf $(LLAMA_SDIST) -C $$t --strip-components=3 \
	  $(addprefix llama_cpp_python-$(LLAMA_PY_VERSION)/vendor/llama.cpp/,$(LLAMA_SUBSET)) && \
	  touch $$t/.extracted && { mv -T $$t $(LLAMA_PRISTINE) 2>/dev/null || rm -rf $$t; }

# Named after the patches' content: once made it never changes, so a checkout's newer patch file
# mtimes do not remake it (several checkouts share the cache). Each patch must apply exactly where it says
# (--fuzz=0, and a hunk found at an offset fails too): a patch that no longer fits is regenerated, not guessed.
ifeq ($(LLAMA_STOCK),)
$(LLAMA_PATCHED)/.extracted: | $(LLAMA_PRISTINE)/.extracted
	t=$$(mktemp -d $(LLAMA_PATCHED).tmp.XXXXXX) && cp -a $(LLAMA_PRISTINE)/. $$t/ && \
	  for p in $(abspath $(LLAMA_PATCH_FILES)); do \
	    out=$$(patch --fuzz=0 --no-backup-if-mismatch -p1 -d $$t < $$p 2>&1) && \
	    ! printf '%s\n' "$$out" | grep -E 'offset|fuzz' || { printf '%s\n' "$$out" >&2; \
	      echo "$$p does not apply exactly (llama/patches/README.md: regenerate it)" >&2; rm -rf $$t; exit 1; }; \
	  done && \
	  touch $$t/.extracted && { mv -T $$t $(LLAMA_PATCHED) 2>/dev/null || rm -rf $$t; }
endif

# LLAMA_CUDA_PREBUILT=FILE (CUDA=1, Ninja): a libggml-cuda.a compiled elsewhere from the same patches and
# flags (bench/gpu/prebuild_cuda.sh: PyPI's nvcc on a machine without a GPU; FILE.id holds the
# $(LLAMA_BUILD_ID) it was built for) stands in for ggml-cuda's 145 nvcc compiles, about 4 of a
# GPU machine's 5 minutes of build: its build statement becomes a phony one, so ninja keeps the file.
LLAMA_CUDA_PREBUILT ?=
ifneq ($(LLAMA_CUDA_PREBUILT),)
$(if $(LLAMA_CUDA_LIB),,$(error LLAMA_CUDA_PREBUILT=$(LLAMA_CUDA_PREBUILT) needs CUDA=1))
LLAMA_PREBUILT_STEP := { test "$$(cat $(LLAMA_CUDA_PREBUILT).id)" = $(LLAMA_BUILD_ID) || { echo \
	  "LLAMA_CUDA_PREBUILT=$(LLAMA_CUDA_PREBUILT) was built for another build id than $(LLAMA_BUILD_ID)" >&2; false; }; } && \
	  install -D -m 644 $(LLAMA_CUDA_PREBUILT) $(LLAMA_BUILD)/$(LLAMA_CUDA_LIB) && \
	  sed -i "s|^build $(LLAMA_CUDA_LIB): .*|build $(LLAMA_CUDA_LIB): phony|" $(LLAMA_BUILD)/build.ninja &&
endif

# One build at a time per build directory (flock): checkouts sharing the cache may run make at once.
$(LLAMA_STAMP): | $(LLAMA_SRC)/.extracted
	mkdir -p $(LLAMA_BUILD) && flock $(LLAMA_BUILD)/.lock sh -c '\
	  test -f $@ || { cmake -S $(LLAMA_SRC) -B $(LLAMA_BUILD) $(if $(shell command -v ninja),-G Ninja) $(LLAMA_CMAKE_FLAGS) && \
	  $(LLAMA_PREBUILT_STEP) cmake --build $(LLAMA_BUILD) --target llama -j$(LLAMA_JOBS) && touch $@; }'

# What bench/gpu/prebuild_cuda.sh configures with and names its archive after.
.PHONY: llama-build-id llama-cmake-flags
llama-build-id: ; @echo $(LLAMA_BUILD_ID)
llama-cmake-flags: ; @echo $(LLAMA_CMAKE_FLAGS)

# A carried copy (LLAMA_SRC=DIR) counts as extracted once its files are there.
ifneq ($(LLAMA_SRC),$(LLAMA_SRC_OWN))
$(LLAMA_SRC)/.extracted:
	test -f $(LLAMA_SRC)/CMakeLists.txt || { echo "LLAMA_SRC=$(LLAMA_SRC) has no llama.cpp source" >&2; exit 1; }
	touch $@
endif

llama-src: $(LLAMA_PATCHED)/.extracted $(LLAMA_RPC_TOOL)/.extracted $(LLAMA_MTMD_TOOL)/.extracted
	test -n "$(DEST)" || { echo "usage: make -C engines llama-src DEST=DIR" >&2; exit 1; }
	mkdir -p $(DEST)/tools/rpc $(DEST)/tools/mtmd && cp -a $(LLAMA_PATCHED)/. $(DEST)/ && \
	  cp -a $(LLAMA_RPC_TOOL)/. $(DEST)/tools/rpc/ && cp -a $(LLAMA_MTMD_TOOL)/. $(DEST)/tools/mtmd/

# -O3 -fno-trapping-math: the log-softmax loops of model.c vectorize (branch-free clamps).
LLAMA_CFLAGS := $(CFLAGS) -O3 -fno-trapping-math -pthread -fopenmp $(LLAMA_INC) $(COMMON_CFLAGS)
LLAMA_LDLIBS := $(LLAMA_LIBS) $(LLAMA_SYS_LIBS) -lstdc++ -lm -fopenmp -lpthread
# The engine and llama-mtmd-ref link libmtmd (llama/mtmd.mk) before llama.cpp's libraries.
LLAMA_MTMD_LDLIBS := $(LLAMA_MTMD_LIB) $(LLAMA_LDLIBS)

# Which variant the binaries in $(BIN) were linked against: switching CPU <-> CUDA relinks.
LLAMA_VARIANT_FILE := $(BIN)/.llama-$(LLAMA_VARIANT)
$(LLAMA_VARIANT_FILE): | $(BIN)
	rm -f $(BIN)/.llama-cpu$(LLAMA_STOCK) $(BIN)/.llama-cuda$(LLAMA_STOCK)
	touch $@

# The build id a file kept on disk must match (persist.c): the engine's sources, llama.cpp's version,
# patches and CMake flags, the compiler flags. sha256 and xxHash come from llama.cpp's vendor/hash.
LLAMA_VENDOR_HASH := $(LLAMA_SRC)/vendor/hash
SP_BUILD_ID := $(shell { cat $(sort $(LLAMA_ENGINE_SRCS) $(LLAMA_ENGINE_HDRS)) $(sort $(wildcard common/*.c common/*.h)) /dev/null; \
  echo '$(LLAMA_PY_VERSION) $(LLAMA_BUILD_ID) $(LLAMA_VARIANT) $(LLAMA_CFLAGS)'; } | sha256sum | cut -c1-16)

# The frame codec and JSON reader come from engines/common ($(COMMON_LIB)). The stock build's engine is
# bin/serveproto-llama-stock (llama/llamax.c turns off what needs a patch).
$(BIN)/serveproto-llama$(LLAMA_STOCK): $(LLAMA_ENGINE_SRCS) $(LLAMA_ENGINE_HDRS) $(COMMON_LIB) $(COMMON_HDR) $(LLAMA_STAMP) $(LLAMA_MTMD_LIB) $(LLAMA_VARIANT_FILE) | $(BIN)
	$(CC) $(LLAMA_CFLAGS) $(LLAMA_MTMD_INC) -I$(LLAMA_VENDOR_HASH) -DSP_BUILD_ID='"$(SP_BUILD_ID)"' -o $@ $(LLAMA_ENGINE_SRCS) \
	  $(LLAMA_VENDOR_HASH)/sha256/sha256.c $(COMMON_LIB) $(COMMON_LDFLAGS) $(LLAMA_MTMD_LDLIBS)

# The reference for bench/engine.py: llama.cpp's own batched decode of a prompt, nothing else.
$(BIN)/llama-prefill-ref: llama/bench/prefill_ref.c llama/bench/ref_common.h $(LLAMA_STAMP) $(LLAMA_VARIANT_FILE) | $(BIN)
	$(CC) $(LLAMA_CFLAGS) -o $@ $< $(LLAMA_LDLIBS)

# Every logit of a few decodes hashed: two builds' kernels compared bit for bit (bench/README.md, "Long documents").
$(BIN)/llama-logit-hash: llama/bench/logit_hash.c llama/bench/ref_common.h $(LLAMA_STAMP) $(LLAMA_VARIANT_FILE) | $(BIN)
	$(CC) $(LLAMA_CFLAGS) -o $@ $< $(LLAMA_LDLIBS)

# llama.cpp's own multimodal path (mtmd_tokenize, mtmd_helper_eval_chunk_single) on a prompt with pictures: the
# reference of the engine's pictures (tests/engines/test_llama_pictures.py). Its logprobs are written over the
# engine's logsumexp (llama/lse.h) and number format (engines/common).
$(BIN)/llama-mtmd-ref: llama/bench/mtmd_ref.c llama/bench/ref_common.h llama/lse.h $(COMMON_LIB) $(LLAMA_STAMP) $(LLAMA_MTMD_LIB) $(LLAMA_VARIANT_FILE) | $(BIN)
	$(CC) $(LLAMA_CFLAGS) $(LLAMA_MTMD_INC) -Illama -o $@ $< $(COMMON_LIB) $(LLAMA_MTMD_LDLIBS)

# llama.cpp's llama_tokenize of texts, timed (bench/README.md, "Tokenizing"; tests/engines/test_llama_tokenize.py).
$(BIN)/llama-tokenize-ref: llama/bench/tokenize_ref.c llama/bench/ref_common.h $(LLAMA_STAMP) $(LLAMA_VARIANT_FILE) | $(BIN)
	$(CC) $(LLAMA_CFLAGS) -o $@ $< $(LLAMA_LDLIBS)

# llama-server from the same sdist, stock (no patches): the peer bench/repeat.py and bench/load.py
# measure against. Not part of `all`: `make -C engines llama-server` (a few minutes the first time).
# CUDA=1 builds it with the CUDA backend, without flash-attention kernels (the engine's GPU default
# reads without them, and they are most of the build's time). Where there is no network, LLAMA_FULL=DIR
# names a carried copy of the sdist's llama.cpp (bench/gpu/prepare.sh carries one).
LLAMA_FULL         ?= $(LLAMA_CACHE)/full
LLAMA_SERVER_BUILD := $(LLAMA_CACHE)/build-server$(if $(filter 1,$(CUDA)),-cuda)
LLAMA_SERVER_CUDA  := $(if $(filter 1,$(CUDA)),-DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_FA=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=$(or $(CUDA_ARCH),90))
ifeq ($(LLAMA_FULL),$(LLAMA_CACHE)/full)
$(LLAMA_FULL)/.extracted: | $(LLAMA_SDIST)
	t=$$(mktemp -d $(LLAMA_FULL).tmp.XXXXXX) && \
	  tar -xzf $(LLAMA_SDIST) -C $$t --strip-components=3 llama_cpp_python-$(LLAMA_PY_VERSION)/vendor/llama.cpp/ && \
	  touch $$t/.extracted && { mv -T $$t $(LLAMA_FULL) 2>/dev/null || rm -rf $$t; }
else
$(LLAMA_FULL)/.extracted:
	test -f $(LLAMA_FULL)/tools/server/CMakeLists.txt || { echo "LLAMA_FULL=$(LLAMA_FULL) has no llama.cpp server source" >&2; exit 1; }
	touch $@
endif

$(BIN)/llama-server: $(LLAMA_FULL)/.extracted | $(BIN)
	cmake -S $(LLAMA_FULL) -B $(LLAMA_SERVER_BUILD) $(if $(shell command -v ninja),-G Ninja) -DCMAKE_BUILD_TYPE=Release \
	  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
	  $(LLAMA_SERVER_CUDA)
	cmake --build $(LLAMA_SERVER_BUILD) --target llama-server -j$(LLAMA_JOBS)
	cp $(LLAMA_SERVER_BUILD)/bin/llama-server $@

.PHONY: llama-server llama-server-src
llama-server: $(BIN)/llama-server

# What llama-server's build reads of the sdist's llama.cpp (about 10 MB as tgz), copied to DEST:
# bench/gpu/prepare.sh carries it, to build there with LLAMA_FULL=DIR.
LLAMA_SERVER_SUBSET := CMakeLists.txt cmake common ggml src include vendor tools app licenses scripts LICENSE
llama-server-src: $(LLAMA_FULL)/.extracted
	test -n "$(DEST)" || { echo "usage: make -C engines llama-server-src DEST=DIR" >&2; exit 1; }
	mkdir -p $(DEST) && cd $(LLAMA_FULL) && cp -a $(LLAMA_SERVER_SUBSET) $(abspath $(DEST))/

# serveproto-quantize: llama.cpp's own quantizer (llama_model_quantize, already in libllama.a) to F32,
# for `serveproto serve --precision f32` (gateway/engine/precision.py). Its source is outside llama/*.c, the
# engine's sources. Not in the stock build, which would relink it under the same name against stock
# llama.cpp (and a later patched make, finding it newer than its stamp, would keep that one).
ifeq ($(LLAMA_STOCK),)
all: $(BIN)/serveproto-quantize
endif
$(BIN)/serveproto-quantize: llama/tools/quantize.c $(LLAMA_STAMP) $(LLAMA_VARIANT_FILE) | $(BIN)
	$(CC) $(LLAMA_CFLAGS) -o $@ $< $(LLAMA_LDLIBS)

# ggml-rpc-server: llama.cpp's RPC server (the sdist's tools/rpc, one C++ file), linked against the
# same patched ggml as the engine, so a remote layer runs our CPU kernels (started with
# GGML_CPU_USE_REF=1, spec/llama-engine.md "Several devices"). Compiled here rather than through
# CMake's tools/ tree, which would bring common/ and every other tool. Its source sits beside the
# subset (the subset's directory is shared by checkouts that predate it); a carried copy
# (LLAMA_SRC=DIR from `llama-src`) holds it under tools/rpc.
$(LLAMA_RPC_TOOL)/.extracted: | $(LLAMA_SDIST)
	t=$$(mktemp -d $(LLAMA_RPC_TOOL).tmp.XXXXXX) && tar -xzf $(LLAMA_SDIST) -C $$t --strip-components=5 \
	  llama_cpp_python-$(LLAMA_PY_VERSION)/vendor/llama.cpp/tools/rpc && \
	  touch $$t/.extracted && { mv -T $$t $(LLAMA_RPC_TOOL) 2>/dev/null || rm -rf $$t; }
ifeq ($(LLAMA_SRC),$(LLAMA_SRC_OWN))
LLAMA_RPC_DIR := $(LLAMA_RPC_TOOL)
else
LLAMA_RPC_DIR := $(LLAMA_SRC)/tools/rpc
$(LLAMA_RPC_DIR)/.extracted:
	test -f $(LLAMA_RPC_DIR)/rpc-server.cpp || { echo "LLAMA_SRC=$(LLAMA_SRC) has no tools/rpc/rpc-server.cpp" >&2; exit 1; }
	touch $@
endif
$(BIN)/ggml-rpc-server: $(LLAMA_RPC_DIR)/.extracted $(LLAMA_STAMP) $(LLAMA_VARIANT_FILE) | $(BIN)
	$(CXX) -O2 -std=c++17 -pthread -I$(LLAMA_SRC)/ggml/include -o $@ $(LLAMA_RPC_DIR)/rpc-server.cpp \
	  $(LLAMA_GGML_LIBS) $(LLAMA_SYS_LIBS) -lm -fopenmp -lpthread
