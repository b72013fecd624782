SHELL := /bin/bash
# konnect — see README.md. Every target works on a fresh machine with only Go installed (run as root for the
# end-to-end tests and benchmarks: they use network namespaces and Debian packages).

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS   := -X main.version=$(VERSION)
BIN       := bin/konnect
# Unit and integration tests: every package of the module (test/reliability needs root, sshd, openssl and
# kubectl, which `deps` provides; test/e2e sits behind its build tag and runs in `e2e`).
UNIT_PKGS := ./...
E2E_TIMEOUT ?= 60m
FUZZTIME  ?= 10s

.PHONY: all build test test-unit fuzz e2e e2e-tools deps bench demo lint clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/konnect

# Everything: lint, unit and integration tests under the race detector, short fuzz runs, and the real-cluster
# end-to-end suite. .ci/run calls this.
test: lint test-unit fuzz e2e

# deps first: -race needs a C compiler, and the integration tests need sshd, openssl and curl.
test-unit: deps
	$(GO) test -race -count=1 -timeout 20m $(UNIT_PKGS)

fuzz:
	bash hack/fuzz.sh $(FUZZTIME)

deps:
	bash hack/install-deps.sh

e2e-tools: deps
	bash test/e2e/tools/build.sh

e2e: build e2e-tools
	@mkdir -p .cache
	KONNECT_BIN=$(CURDIR)/$(BIN) $(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./test/e2e/ 2>&1 | tee .cache/e2e.log; exit $${PIPESTATUS[0]}

bench: build e2e-tools
	bash hack/bench.sh

demo: build
	bash hack/demo.sh

# No build output, download or image in git: any tracked file over 1 MB fails the lint.
lint:
	@big=$$(git ls-files -z 2>/dev/null | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1000000 {print $$2}'); if [ -n "$$big" ]; then echo "tracked files over 1 MB:"; echo "$$big"; exit 1; fi
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/e2e/

clean:
	rm -rf bin _demo .cache
