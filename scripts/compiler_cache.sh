# Sourced by the build scripts, in the checkout's root. Compiles through ccache (which
# scripts/setup.sh installs) with paths taken relative to the checkout, so that every
# clone of the repository, a fresh CI clone included, reuses the objects that an earlier
# build of the same sources compiled. Sets `launcher` to the CMake arguments that do it
# (empty without ccache).
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
