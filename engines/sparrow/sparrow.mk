# engines/sparrow: serveproto-sparrow, the decision engine of sparrow-decider's static models
# (spec/sparrow-engine.md). -ffp-contract=off keeps every float operation as written: the package's
# numpy does them one by one, unfused.
SPARROW_SRC := sparrow/sparrow.c sparrow/model.c sparrow/text.c
SPARROW_HDR := sparrow/model.h $(COMMON_HDR)

all: $(BIN)/serveproto-sparrow

$(BIN)/serveproto-sparrow: $(SPARROW_SRC) $(SPARROW_HDR) $(COMMON_LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -ffp-contract=off $(COMMON_CFLAGS) -Isparrow $(SPARROW_SRC) $(COMMON_LIB) $(COMMON_LDFLAGS) -lm -o $@
