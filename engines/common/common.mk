# engines/common: the frame codec, the JSON reader, the DECIDE record checks, the SCORE payload's grammar
# (score_request.h) and the frame loop (loop.h) every engine links, and
# codec-check, the conformance driver of tests/engines/test_c_codec.py.
# An engine links $(COMMON_LIB) and compiles with $(COMMON_CFLAGS) (then -lm); its link line carries
# $(COMMON_LDFLAGS): -rdynamic puts the engine's own (non-static) function names in its dynamic symbol table,
# so the stack stack.c writes at a stall names them. A link flag: the compiled code is the same (the llama
# engine's logprobs compared bit for bit with and without it, issue 46).
COMMON_CFLAGS := -Icommon
COMMON_HDR    := common/frame.h common/json.h common/loop.h common/decide_record.h common/stack.h common/score_request.h
COMMON_OBJ    := $(BIN)/obj/common/frame.o $(BIN)/obj/common/json.o $(BIN)/obj/common/loop.o $(BIN)/obj/common/decide_record.o \
                 $(BIN)/obj/common/stack.o $(BIN)/obj/common/score_request.o
COMMON_LIB    := $(BIN)/libspcommon.a
COMMON_LDFLAGS := -rdynamic -pthread

all: $(BIN)/codec-check

$(BIN)/obj/common/%.o: common/%.c $(COMMON_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(COMMON_CFLAGS) -c $< -o $@

$(COMMON_LIB): $(COMMON_OBJ)
	@mkdir -p $(BIN)
	$(AR) rcs $@ $^

$(BIN)/codec-check: common/codec_check.c $(COMMON_LIB)
	$(CC) $(CFLAGS) $(COMMON_CFLAGS) $< $(COMMON_LIB) -lm -o $@
