# Shortcuts for the commands CI runs (.ci/run) and their longer variants.
# Each target is one line; CONTRIBUTING.md says what each one covers.

.PHONY: test test-short test-long lint bench docker

test:       ; go test -race ./...
test-short: ; go test -race -short ./...
test-long:  ; KEYBRAKE_LONG=1 go test -race -timeout 60m ./...
lint:       ; .ci/run lint
bench:      ; go test -run '^$$' -bench . ./... && go run ./cmd/keybrake-bench
docker:     ; docker build -t keybrake --build-arg VERSION=$$(git describe --always) .
