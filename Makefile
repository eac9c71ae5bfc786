# linseq build. `make` builds the libraries, the CLI and the tests; `make test` runs every
# test plain (test-plain), then under AddressSanitizer + UBSan (test-sanitize),
# ThreadSanitizer (test-tsan) and valgrind (test-valgrind), each fuzz target for 30 s
# (fuzz-short), the Python tests (test-python), and compiles the CUDA backend where nvcc
# exists (cuda-check); test-plain also checks that every C and CUDA file follows
# .clang-format; `make demo` runs the demo; `make install PREFIX=...` installs header,
# libraries and pkg-config file. Nothing here installs system packages: that is
# scripts/install-deps.sh.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2
SAN     ?=
PREFIX  ?= /usr/local
# The repository's own reference cases (tests/refgen, written into the build folder) and
# its judge; and an outside set with its judge, checked as well when the folder exists.
REFCASES := $(BUILD)/refcases
REFJUDGE := tests/refgen/judge.py
# A python3 with NumPy for the generator and the judges (found or made on first use).
PYTHON_NUMPY = $$(sh scripts/python-numpy.sh build/pynumpy)
REFDATA ?= ../shared/refdata
# The spec's SSD (Mamba2) cases, kept apart from REFDATA; checked the same way
REFDATA_SSD ?= ../shared/refdata-ssd
JUDGE   ?= ../shared/tools/check_npy_dir.py

VERSION := $(shell sed -n 's/^\#define LINSEQ_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)/\2/p' include/linseq.h | paste -sd. -)
SOMAJOR := $(firstword $(subst ., ,$(VERSION)))

WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wvla
CFLAGS   ?=
ALL_CFLAGS := -std=c11 -D_POSIX_C_SOURCE=200809L $(OPT) -g $(WARN) -fPIC \
              -fvisibility=hidden -Iinclude -Isrc $(SAN) $(CFLAGS)
LDLIBS_LIB := -lm -lpthread
CJSON_LIBS := -lcjson

# Sources named *_simd.c hold the hot kernels: each is compiled once per ISA (isa.h), with
# that ISA's flags; the rest of the library is built for the baseline target, never
# -march=native, so one build runs on any x86-64.
ISA_SRC  := $(sort $(wildcard src/*/*_simd.c))
LIB_SRC  := $(filter-out $(ISA_SRC),$(sort $(wildcard src/*/*.c)))
X86      := $(if $(findstring x86_64,$(shell $(CC) -dumpmachine)),1,)
ISAS     := scalar $(if $(X86),avx2 avx512)
ISA_FLAGS_scalar := -DLS_ISA=0
ISA_FLAGS_avx2   := -DLS_ISA=1 -mavx2 -mfma
ISA_FLAGS_avx512 := -DLS_ISA=2 -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma
CLI_SRC  := $(sort $(wildcard tools/linseq/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
# Helpers shared by the tests: every tests/*.c that is not a test_*.c program.
TEST_SUPPORT := $(filter-out $(TEST_SRC),$(sort $(wildcard tests/*.c)))
TEST_SUPPORT_OBJ := $(TEST_SUPPORT:%.c=$(BUILD)/obj/%.o)

# CUDA backend (make CUDA=1, needs nvcc): src/cuda/*.cu into the same library, with machine
# code for Ampere (sm_80), Ada (sm_89) and Hopper (sm_90a): the kernels use nothing newer than
# sm_80 (mma.sync m16n8k16 bf16 is their newest instruction). The default build stays
# CPU-only. `make cuda-check` compiles the CUDA sources with the register report and fails on
# spills or local memory. Experimental: the backend has not yet run on a GPU.
CUDA      ?= 0
NVCC      ?= nvcc
# (nvcc resolved through any symlink, e.g. /usr/bin/nvcc -> /usr/local/cuda-X/bin/nvcc)
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell readlink -f "$$(command -v $(NVCC))" 2>/dev/null)))
CUDA_GENCODE ?= -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_89,code=sm_89 \
                -gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_90,code=compute_90
CUDA_SRC  := $(sort $(wildcard src/cuda/*.cu))
NVCC_FLAGS := -std=c++17 -O3 $(CUDA_GENCODE) -Xcompiler -fPIC,-fvisibility=hidden \
              -Iinclude -Isrc -lineinfo -Xptxas -v -DLINSEQ_WITH_CUDA
ifeq ($(CUDA),1)
ALL_CFLAGS += -DLINSEQ_WITH_CUDA -I$(CUDA_HOME)/include
LDLIBS_LIB += -L$(CUDA_HOME)/lib64 -lcudart -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) \
            $(foreach i,$(ISAS),$(ISA_SRC:%.c=$(BUILD)/obj/%.$(i).o))
ifeq ($(CUDA),1)
LIB_OBJ  += $(CUDA_SRC:%.cu=$(BUILD)/obj/%.o)
endif
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# The CLI sources minus main.c, linked into the tests that exercise the .npy reader and cases.
CLI_LIB_OBJ := $(filter-out $(BUILD)/obj/tools/linseq/main.o,$(CLI_OBJ))

STATIC := $(BUILD)/liblinseq.a
SHARED := $(BUILD)/liblinseq.so.$(VERSION)
# Every library object with its internal symbols still global, for the programs that call
# internal functions (the CLI, the tests, the fuzz targets); never installed.
INTERNAL := $(BUILD)/liblinseq-internal.a
CLI    := $(BUILD)/linseq

.PHONY: all lib test test-run test-plain test-sanitize test-python demo install clean deps
# Keep the test objects make would otherwise treat as intermediate and delete.
.SECONDARY:
all: lib $(CLI) $(TEST_BIN)
lib: $(STATIC) $(SHARED)

# Fails early, naming the command that installs cJSON, when its header is missing; a build
# never installs system packages by itself.
deps:
	@printf '#include <cjson/cJSON.h>\n' | $(CC) $(CFLAGS) -E -x c - >/dev/null 2>&1 || \
	  { echo "cJSON (cjson/cJSON.h) is missing: the CLI needs it." \
	    "Install the build's dependencies with: sh scripts/install-deps.sh" >&2; exit 1; }

$(BUILD)/obj/%.o: %.c include/linseq.h $(wildcard src/*/*.h) $(wildcard tools/linseq/*.h) $(wildcard tests/*.h) \
                 $(wildcard fuzz/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

# ptxas's report (registers, stack frame, spills) is kept beside each object
$(BUILD)/obj/%.o: %.cu include/linseq.h $(wildcard src/*/*.h) $(wildcard src/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@ 2> $@.ptxas || { cat $@.ptxas; exit 1; }

define ISA_RULE
$(BUILD)/obj/%.$(1).o: %.c include/linseq.h $(wildcard src/*/*.h)
	@mkdir -p $$(dir $$@)
	$$(CC) $$(ALL_CFLAGS) $$(ISA_FLAGS_$(1)) -c $$< -o $$@
endef
$(foreach i,$(ISAS),$(eval $(call ISA_RULE,$(i))))

# The installed archive holds one object, the library partially linked (ld -r) with every
# hidden symbol made local, so that a program linking it statically sees only the linseq_
# API, as with the shared library (tests/check_symbols.sh checks both).
LD      ?= ld
OBJCOPY ?= objcopy
$(STATIC): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(LD) -r -o $(BUILD)/liblinseq.o $^
	$(OBJCOPY) --localize-hidden $(BUILD)/liblinseq.o
	rm -f $@ && ar rcs $@ $(BUILD)/liblinseq.o

$(INTERNAL): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(SHARED): $(LIB_OBJ)
	$(CC) $(ALL_CFLAGS) -shared -Wl,-soname,liblinseq.so.$(SOMAJOR) -o $@ $^ $(LDLIBS_LIB)
	ln -sf liblinseq.so.$(VERSION) $(BUILD)/liblinseq.so.$(SOMAJOR)
	ln -sf liblinseq.so.$(SOMAJOR) $(BUILD)/liblinseq.so

$(CLI): $(CLI_OBJ) $(INTERNAL) | deps
	$(CC) $(ALL_CFLAGS) -o $@ $(CLI_OBJ) $(INTERNAL) $(CJSON_LIBS) $(LDLIBS_LIB)

$(CLI_OBJ): | deps

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_SUPPORT_OBJ) $(CLI_LIB_OBJ) $(INTERNAL)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(TEST_SUPPORT_OBJ) $(CLI_LIB_OBJ) $(INTERNAL) \
	  $(CJSON_LIBS) $(LDLIBS_LIB)

# Every unit test, the CLI over every reference case in every mode, the independent judge
# over the files `linseq run` writes, and the CLI over malformed cases and bad arguments.
test-run: all $(REFCASES)/index.json
	@set -e; for t in $(TEST_BIN); do echo "== $$t"; $$t; done
	@PYTHON=$(PYTHON_NUMPY) sh tests/check_refdata.sh $(CLI) $(REFCASES) $(REFJUDGE)
	@PYTHON=$(PYTHON_NUMPY) sh tests/check_refdata.sh --skip-if-absent $(CLI) $(REFDATA) $(JUDGE)
	@PYTHON=$(PYTHON_NUMPY) sh tests/check_refdata.sh --skip-if-absent $(CLI) $(REFDATA_SSD) $(JUDGE)
	@sh tests/check_cli_errors.sh $(CLI) $(REFCASES)

# Regenerated whenever the generator changes (NumPy float64, seconds).
$(REFCASES)/index.json: $(wildcard tests/refgen/*.py)
	$(PYTHON_NUMPY) tests/refgen/gen.py $(REFCASES)

test-plain:
	$(MAKE) test-run
	@sh scripts/check-format.sh
	@sh scripts/check-layers.sh
	@sh tests/check_symbols.sh $(STATIC) $(SHARED)
	@sh tests/check_cuda_check.sh
	@BUILD=$(BUILD) sh tests/check_install.sh

test-sanitize:
	$(MAKE) BUILD=build/sanitize OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" test-run

# ThreadSanitizer over the unit tests (test_bench runs the CLI, and test_op_coverage reads
# the generated reference cases, which this build does not make: both are left out); its
# target is test_concurrency, where 8 caller threads race through every op, and the
# library's own thread pool (core/parallel.c: pthreads and C11 atomics, which TSan sees).
TSAN_CC    ?= clang
TSAN_TESTS := $(filter-out test_bench test_op_coverage,$(TEST_SRC:tests/%.c=%))
.PHONY: test-tsan
test-tsan:
	$(MAKE) BUILD=build/tsan CC=$(TSAN_CC) OPT=-O1 SAN="-fsanitize=thread -fno-omit-frame-pointer" \
	  $(TSAN_TESTS:%=build/tsan/tests/%)
	@set -e; for t in $(TSAN_TESTS); do echo "== tsan $$t"; \
	    TSAN_OPTIONS="halt_on_error=1" build/tsan/tests/$$t; done

# Valgrind memcheck over the tests that take seconds under it (test_kda takes minutes; the
# determinism test runs every op anyway), test_concurrency for one round: a plain -O1 -g
# build, since a sanitizer runtime and Valgrind cannot share a process. Leaks (definite and
# possible) and uninitialised reads fail it, with no suppression (the library's pool joins
# its workers at exit). Needs valgrind.
VALGRIND_TESTS := test_bad_inputs test_nonfinite test_determinism test_npy test_kda_segment test_ema test_ssd \
                  test_ssm1_segment test_ssd_segment test_ssm1_saved test_kda_bf16 test_scratch
VALGRIND := valgrind -q --error-exitcode=1 --leak-check=full
.PHONY: test-valgrind
test-valgrind:
	$(MAKE) BUILD=build/valgrind OPT=-O1 \
	  $(VALGRIND_TESTS:%=build/valgrind/tests/%) build/valgrind/tests/test_concurrency
	@set -e; for t in $(VALGRIND_TESTS); do echo "== valgrind $$t"; \
	  $(VALGRIND) build/valgrind/tests/$$t; done; \
	  echo "== valgrind test_concurrency (one round)"; \
	  $(VALGRIND) build/valgrind/tests/test_concurrency 1

# The Python package (pip install into build/venv) with NumPy, PyTorch and JAX.
test-python:
	sh scripts/test-python.sh $(REFDATA)

# linseq as a Hugging Face `kernels` repository (tools/kernels/build.py): a CPU build variant
# for the PyTorch that KERNELS_PYTHON imports (or TORCH_VERSION=MAJOR.MINOR), with the Python
# package and this build's shared library inside, in $(BUILD)/kernels/linseq. KERNELS_PYTHON
# defaults to the test environment's Python (make test-python makes it), which has torch.
KERNELS_PYTHON ?= $(if $(wildcard build/venv/bin/python),build/venv/bin/python,python3)
.PHONY: kernels-build
kernels-build: lib
	$(KERNELS_PYTHON) tools/kernels/build.py --library $(SHARED) --out $(BUILD)/kernels/linseq \
	  $(if $(TORCH_VERSION),--torch-version $(TORCH_VERSION))

# The CUDA tests (tests/cuda/test_*.c, make CUDA=1): each compares one op family's CUDA
# kernels with the CPU path; each skips itself on a machine without a GPU.
CUDA_TEST_SRC := $(sort $(wildcard tests/cuda/test_*.c))
CUDA_TEST_BIN := $(CUDA_TEST_SRC:tests/cuda/%.c=$(BUILD)/tests/cuda/%)
CUDA_TEST_SUPPORT := $(BUILD)/obj/tests/cuda/cuda_testutil.o $(BUILD)/obj/tests/testutil.o
$(BUILD)/tests/cuda/%: $(BUILD)/obj/tests/cuda/%.o $(CUDA_TEST_SUPPORT) $(INTERNAL)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(CUDA_TEST_SUPPORT) $(INTERNAL) $(LDLIBS_LIB)

.PHONY: cuda-tests cuda-test-run
cuda-tests: lib $(CUDA_TEST_BIN)
cuda-test-run: cuda-tests
	@set -e; for t in $(CUDA_TEST_BIN); do echo "== $$t"; $$t; done

# Compiles the CUDA backend and its tests where nvcc exists (no GPU needed), so they never
# rot unseen, and checks ptxas's report for spills.
.PHONY: cuda-check
cuda-check:
	@if command -v $(NVCC) >/dev/null 2>&1; then \
	  $(MAKE) CUDA=1 BUILD=build/cuda -j$$(nproc 2>/dev/null || echo 2) cuda-tests && \
	  sh scripts/cuda-check.sh build/cuda; \
	else echo "cuda-check: no nvcc on this machine; CUDA sources not compiled"; fi

test: test-plain test-sanitize test-tsan test-valgrind fuzz-short test-python cuda-check
	@echo "make test: every test passed (plain, ASan+UBSan, TSan, valgrind, fuzz, Python, CUDA build)"

# Every libFuzzer target of fuzz/ for 30 s (needs clang and its sanitizer and fuzzer
# runtimes; see scripts/fuzz.sh).
.PHONY: fuzz-short
fuzz-short:
	sh scripts/fuzz.sh 30

demo: $(CLI)
	$(CLI) demo

# The dynamic loader searches /usr/lib by itself and /usr/local/lib through its cache
# (refreshed by ldconfig below); a program built against any other prefix finds the shared
# library through the run path that linseq.pc adds to its link line.
PC_RPATH = $(if $(filter /usr /usr/local,$(PREFIX)),,-Wl$(comma)-rpath$(comma)$${libdir})
comma := ,
install: lib
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/linseq.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(STATIC) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHARED) $(DESTDIR)$(PREFIX)/lib/
	ln -sf liblinseq.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/liblinseq.so.$(SOMAJOR)
	ln -sf liblinseq.so.$(SOMAJOR) $(DESTDIR)$(PREFIX)/lib/liblinseq.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' -e 's|@RPATH@|$(PC_RPATH)|' \
	  linseq.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/linseq.pc
	@if [ -z "$(DESTDIR)" ] && [ "$(PREFIX)" = /usr/local ]; then \
	  if [ "$$(id -u)" = 0 ]; then ldconfig; \
	  else echo "install: run 'sudo ldconfig' so that programs find liblinseq.so.$(SOMAJOR)"; fi; \
	fi

clean:
	rm -rf build
