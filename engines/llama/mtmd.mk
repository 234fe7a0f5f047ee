# engines/llama/mtmd.mk: llama.cpp's multimodal library (libmtmd: tools/mtmd of the same sdist), compiled
# by our own rules against the headers of the llama.cpp source the engine links (patched, or pristine for
# the stock build), so the llama.cpp build directories keep their ids and are not rebuilt. Included by
# llama.mk after its variables; spec/llama-engine.md "Pictures".
#
# The sources sit beside the subset ($(LLAMA_MTMD_TOOL), like tools-rpc); a carried copy (LLAMA_SRC=DIR
# from `llama-src`) holds them under tools/mtmd. The archive is named after the variant and the build id
# (the headers it was compiled against differ between them): $(LLAMA_MTMD_BUILD)/libmtmd.a, one per
# cache, shared by checkouts (flock, as the llama.cpp build). No ffmpeg video helper (MTMD_VIDEO off, as
# in a build without LLAMA_SUBPROCESS): pictures are decoded by stb_image inside mtmd-helper.cpp.

LLAMA_MTMD_TOOL := $(LLAMA_CACHE)/tools-mtmd
$(LLAMA_MTMD_TOOL)/.extracted: | $(LLAMA_SDIST)
	t=$$(mktemp -d $(LLAMA_MTMD_TOOL).tmp.XXXXXX) && tar -xzf $(LLAMA_SDIST) -C $$t --strip-components=5 \
	  llama_cpp_python-$(LLAMA_PY_VERSION)/vendor/llama.cpp/tools/mtmd && \
	  touch $$t/.extracted && { mv -T $$t $(LLAMA_MTMD_TOOL) 2>/dev/null || rm -rf $$t; }
ifeq ($(LLAMA_SRC),$(LLAMA_SRC_OWN))
LLAMA_MTMD_DIR := $(LLAMA_MTMD_TOOL)
else
LLAMA_MTMD_DIR := $(LLAMA_SRC)/tools/mtmd
$(LLAMA_MTMD_DIR)/.extracted:
	test -f $(LLAMA_MTMD_DIR)/mtmd.cpp || { echo "LLAMA_SRC=$(LLAMA_SRC) has no tools/mtmd/mtmd.cpp" >&2; exit 1; }
	touch $@
endif

LLAMA_MTMD_BUILD := $(LLAMA_CACHE)/mtmd-$(LLAMA_VARIANT)-$(LLAMA_BUILD_ID)
LLAMA_MTMD_LIB   := $(LLAMA_MTMD_BUILD)/libmtmd.a
LLAMA_MTMD_INC   := -I$(LLAMA_MTMD_DIR)
# What tools/mtmd/CMakeLists.txt compiles (its add_library(mtmd ...) list, every model's graph: clip.cpp
# names them all), plus vendor/hash (mtmd-helper's sha256 of a picture's bytes). -O2 and C++17 as a
# Release build of it; -w: third-party code, its warnings are upstream's.
LLAMA_MTMD_CXXFLAGS := -O2 -std=c++17 -pthread -w -DNDEBUG -I$(LLAMA_SRC)/include -I$(LLAMA_SRC)/ggml/include \
  -I$(LLAMA_SRC)/vendor -I$(LLAMA_SRC)/vendor/hash -I$(LLAMA_MTMD_DIR)

# Compiled by a make of its own (llama/mtmd-lib.mk) under the lock: two checkouts sharing the cache may
# run make at once. The archive is the stamp.
$(LLAMA_MTMD_LIB): | $(LLAMA_MTMD_DIR)/.extracted $(LLAMA_SRC)/.extracted
	mkdir -p $(LLAMA_MTMD_BUILD) && flock $(LLAMA_MTMD_BUILD)/.lock sh -c 'test -f $@ || \
	  $(MAKE) -f llama/mtmd-lib.mk -j$(LLAMA_JOBS) MTMD_DIR=$(LLAMA_MTMD_DIR) HASH_DIR=$(LLAMA_SRC)/vendor/hash \
	    OUT=$(LLAMA_MTMD_BUILD) CC="$(CC)" CXX="$(CXX)" CXXFLAGS="$(LLAMA_MTMD_CXXFLAGS)"'
