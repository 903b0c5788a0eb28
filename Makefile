# Thin wrapper: every target installs what is missing, configures and builds first.
.PHONY: all demo test test-asan test-valgrind format format-check clean

all:
	scripts/setup.sh

demo:
	scripts/setup.sh
	./build/examples/fashion_mnist --model mlp --epochs 1 --lr 0.05 --lr-schedule cosine --amp bf16

test:
	scripts/setup.sh --asan
	meson test -C build --print-errorlogs
	meson test -C build-asan --print-errorlogs --no-suite tools --no-suite examples

test-valgrind:
	scripts/setup.sh
	meson test -C build --setup=valgrind --print-errorlogs --no-suite tools --no-suite examples --no-suite mpi

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

format-check:
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan
