#!/bin/bash
# Builds one probe against the release (out: bin/NAME) and the ASan (bin/NAME.asan) library.
set -e
cd "$(dirname "$0")"
mkdir -p bin
n=$1
g++ -std=c++20 -O1 -g -I../include "$n.cc" -o "bin/$n" -L../build/lib -ltiermem -Wl,-rpath,$PWD/../build/lib -lpthread
if [ -f ../build-asan/lib/libtiermem.so ]; then
  g++ -std=c++20 -O1 -g -fsanitize=address,undefined -I../include "$n.cc" -o "bin/$n.asan" -L../build-asan/lib -ltiermem -Wl,-rpath,$PWD/../build-asan/lib -lpthread
fi
