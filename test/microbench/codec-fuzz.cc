// Fuzzes the vsnap-c1 CPU decoder (native/codec/codec.cc) with randomly damaged chunks under
// AddressSanitizer and UBSan: every decode must either succeed or throw E_CODEC_CORRUPT, and
// never read or write outside its buffers (each input and output is its own exact-size heap
// allocation, so ASan sees any overrun). Build and run from the repository root:
//   g++ -std=c++17 -O1 -g -fsanitize=address,undefined -Inative -I/usr/local/cuda/include \
//     test/microbench/codec-fuzz.cc native/codec/codec.cc native/common/error.cc -o /tmp/codec-fuzz && /tmp/codec-fuzz
#include "codec/codec.h"
#include "common/error.h"
#include <cstdio>
#include <cstring>
#include <random>
#include <memory>
using namespace vsnap;
int main(){
  std::mt19937_64 r(5); std::normal_distribution<float> g(0,0.02f);
  long ok=0,bad=0;
  for (int kind=1; kind<=6; kind++) for (size_t size : {1ul,3ul,4097ul,20001ul,70001ul}) {
    std::vector<uint8_t> raw(size);
    for (size_t i=0;i<size;i++){ float f=g(r); uint32_t u; memcpy(&u,&f,4); raw[i]= (i%2)? (u>>24) : (u>>16); }
    auto c = codec::encode(raw.data(), size, kind);
    for (int it=0; it<3000; it++) {
      std::vector<uint8_t> d = c;
      int flips = 1 + r()%6;
      for (int f=0; f<flips; f++) d[r()%d.size()] ^= 1 + r()%255;
      if (r()%4==0) d.resize(d.size() - (r()%3));
      std::unique_ptr<uint8_t[]> in(new uint8_t[d.size()]); memcpy(in.get(), d.data(), d.size());
      std::unique_ptr<uint8_t[]> out(new uint8_t[size]);
      try { codec::decode(in.get(), d.size(), out.get(), size); ok++; } catch (const NativeError& e) { if (e.code()!="E_CODEC_CORRUPT") {printf("other %s\n", e.code().c_str()); return 1;} bad++; }
    }
  }
  printf("decoded %ld refused %ld (no other outcome)\n", ok, bad);
}
