SHELL := /bin/bash
# konnect — see README.md. Every target works on a fresh machine with only Go installed (run as root for the
# end-to-end tests and benchmarks: they use network namespaces and Debian packages).

GO        ?= go
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS   := -X github.com/konnect-dev/konnect/cmd/internal/buildinfo.Version=$(VERSION)
BIN       := bin/konnect
# The container image (`make image`): its name, which `konnect init --image` defaults to for this VERSION, the
# docker-archive it is written to, and its timestamps, the commit time unless SOURCE_DATE_EPOCH is set.
IMAGE     ?= ghcr.io/konnect-dev/konnect:$(VERSION)
IMAGE_TAR := bin/konnect-image.tar
# `make image-multiarch`: one OCI image index for PLATFORMS, in an OCI image layout tarball; the static
# binaries go to IMAGE_BIN_DIR/OS_ARCH/konnect.
PLATFORMS       ?= linux/amd64,linux/arm64
IMAGE_INDEX_TAR ?= bin/konnect-image.oci.tar
IMAGE_BIN_DIR   ?= bin/image
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# Unit and integration tests: every package of the module (test/reliability needs root, sshd, openssl and
# kubectl, which `deps` provides; test/e2e sits behind its build tag and runs in `e2e`). The tiers, in
# test/README.md:
#   go test ./...                    the inner loop: no root, sshd, namespace or upstream binary (`make test-fast`)
#   go test -tags integration ./...  all but the real clusters: root, sshd, upstream binaries, kubectl, curl
#   test/e2e                         behind its own tag, in `make e2e`
UNIT_PKGS := ./...
E2E_TIMEOUT ?= 60m
FUZZTIME  ?= 10s

.PHONY: all build static static-multiarch image image-multiarch test test-unit test-fast fuzz e2e e2e-tools deps bench demo lint clean

all: build

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/konnect

# The static binary the image ships, and the one `make bench` runs: built with the flags of upstream's
# proxy-server and proxy-agent there (CGO_ENABLED=0, -trimpath, -s -w).
static:
	@mkdir -p bin/image
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '-s -w $(LDFLAGS)' -o bin/image/konnect ./cmd/konnect

# konnect's container image, built offline and reproducibly by hack/image (no daemon, registry or base image):
# the static binary at /usr/local/bin/konnect as entrypoint, user 65534:65534, OCI labels. The docker-archive
# loads with `ctr images import`, `docker load` and `podman load`; the digest printed is its config digest.
IMAGE_FLAGS = -tag '$(IMAGE)' -entrypoint /usr/local/bin/konnect -user 65534:65534 \
	-label 'org.opencontainers.image.version=$(VERSION)' -label 'org.opencontainers.image.revision=$(REVISION)' \
	-label org.opencontainers.image.source=https://github.com/konnect-dev/konnect -created '$(SOURCE_DATE_EPOCH)'

image: static
	$(GO) build -o bin/image/build ./hack/image
	@digest=$$(bin/image/build -o $(IMAGE_TAR) $(IMAGE_FLAGS) -file bin/image/konnect:/usr/local/bin/konnect:0755) && \
		echo "$(IMAGE_TAR): $(IMAGE) $$digest"

# The static binary for each of PLATFORMS, cross-compiled with the flags of `static`.
static-multiarch:
	@set -e; for p in $$(echo '$(PLATFORMS)' | tr , ' '); do \
		os=$${p%%/*}; arch=$${p#*/}; echo "static $$p: $(IMAGE_BIN_DIR)/$${os}_$${arch}/konnect"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -buildvcs=false -ldflags '-s -w $(LDFLAGS)' \
			-o $(IMAGE_BIN_DIR)/$${os}_$${arch}/konnect ./cmd/konnect; \
	done

# The image for each of PLATFORMS (default linux/amd64 and linux/arm64), as `make image` builds it, as one OCI
# image index: `ctr images import --all-platforms`, `docker load` (Docker 25 or later), or `skopeo copy
# oci-archive:...` to push it. The digest printed is the index's, which a registry shows for the tag.
image-multiarch: static-multiarch
	$(GO) build -o $(IMAGE_BIN_DIR)/build ./hack/image
	@digest=$$($(IMAGE_BIN_DIR)/build -o $(IMAGE_INDEX_TAR) $(IMAGE_FLAGS) -platform '$(PLATFORMS)' \
		-file '$(IMAGE_BIN_DIR)/{os}_{arch}/konnect:/usr/local/bin/konnect:0755') && echo "$(IMAGE_INDEX_TAR): $(IMAGE) $$digest"

# Everything: lint, unit and integration tests under the race detector, short fuzz runs, and the real-cluster
# end-to-end suite. .ci/run calls this.
test: lint test-unit fuzz e2e

# deps first: -race needs a C compiler, and the integration tests need sshd, openssl and curl.
test-unit: deps
	$(GO) test -race -count=1 -timeout 20m -tags integration $(UNIT_PKGS)

# The inner loop: the tests that need nothing beyond Go, as any user.
test-fast:
	$(GO) test $(UNIT_PKGS)

fuzz:
	bash hack/fuzz.sh $(FUZZTIME)

deps:
	bash hack/install-deps.sh

e2e-tools: deps
	bash test/e2e/tools/build.sh

e2e: build e2e-tools image
	@mkdir -p .cache
	KONNECT_BIN=$(CURDIR)/$(BIN) KONNECT_IMAGE=$(CURDIR)/bin/konnect-image.tar $(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./test/e2e/ 2>&1 | tee .cache/e2e.log; exit $${PIPESTATUS[0]}

bench: static e2e-tools
	bash hack/bench.sh

# hack/demo.sh builds bin/konnect itself, after checking its ports, and says how long a first build takes.
demo:
	GO='$(GO)' KONNECT_LDFLAGS='$(LDFLAGS)' bash hack/demo.sh

# No build output, download or image in git: any tracked file over 1 MB fails the lint.
lint:
	@big=$$(git ls-files -z 2>/dev/null | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1000000 {print $$2}'); if [ -n "$$big" ]; then echo "tracked files over 1 MB:"; echo "$$big"; exit 1; fi
	@out=$$(gofmt -l $$(git ls-files --cached --others --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './.cache/*')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags integration ./...
	$(GO) vet -tags e2e ./test/e2e/

clean:
	rm -rf bin _demo .cache
