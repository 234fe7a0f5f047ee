# engines/llama/mtmd-lib.mk: compiles llama.cpp's tools/mtmd into $(OUT)/libmtmd.a (run by llama/mtmd.mk,
# which passes MTMD_DIR, HASH_DIR, OUT, CC, CXX and CXXFLAGS). The list is tools/mtmd/CMakeLists.txt's
# add_library(mtmd ...) (every model's graph: clip.cpp names them all) plus vendor/hash's hash.cpp
# and sha256.c (mtmd-helper's sha256 of a picture's bytes; the engine links its own sha256.c first).
MTMD_SRCS := $(addprefix $(MTMD_DIR)/,mtmd.cpp mtmd-audio.cpp mtmd-image.cpp mtmd-helper.cpp mtmd-helper-gen.cpp \
  clip.cpp) $(sort $(wildcard $(MTMD_DIR)/models/*.cpp))
MTMD_OBJS := $(patsubst $(MTMD_DIR)/%.cpp,$(OUT)/%.o,$(MTMD_SRCS)) $(OUT)/vendor-hash.o $(OUT)/vendor-sha256.o

$(OUT)/libmtmd.a: $(MTMD_OBJS)
	rm -f $@.tmp && ar rcs $@.tmp $^ && mv $@.tmp $@

$(OUT)/%.o: $(MTMD_DIR)/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(OUT)/vendor-hash.o: $(HASH_DIR)/hash.cpp
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(OUT)/vendor-sha256.o: $(HASH_DIR)/sha256/sha256.c
	$(CC) -O2 -w -I$(HASH_DIR) -c $< -o $@
