#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <vector>
#include <unistd.h>
#include <sys/syscall.h>
struct Cfg { uint8_t palette=1, start_row=0; uint8_t r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={};
  Cfg(){ for(int t=0;t<8;++t){colsb[t]=64;rows[t]=16;} } };
static double now(){ return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
// A: [M/16 blocks][16 rows][K2] words (row stride K2*4); B: [np panels][K2][16] words
__attribute__((noinline)) void g14(const uint32_t* A, int64_t M, int64_t K2, const uint32_t* B, int64_t np, float* C) {
  for (int64_t q = 0; q < np; q += 4) {
    const uint32_t* w = B + q * K2 * 16; const int64_t st = K2 * 16;
    for (int64_t mb = 0; mb < M / 16; ++mb) {
      const uint32_t* a = A + mb * 16 * K2;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t k = 0; k < K2; k += 16) {
        const uint32_t* r = w + k * 16;
        _tile_loadd(4, a + k, K2 * 4);
        _tile_loadd(5, r, 64); _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, r + st, 64); _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, r + 2 * st, 64); _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, r + 3 * st, 64); _tile_dpbf16ps(3, 4, 6);
      }
      _tile_stored(0, C, 256); _tile_stored(1, C + 16, 256); _tile_stored(2, C + 32, 256); _tile_stored(3, C + 48, 256);
    }
  }
}
// 1x4 with 3 B registers
__attribute__((noinline)) void g14r(const uint32_t* A, int64_t M, int64_t K2, const uint32_t* B, int64_t np, float* C) {
  for (int64_t q = 0; q < np; q += 4) {
    const uint32_t* w = B + q * K2 * 16; const int64_t st = K2 * 16;
    for (int64_t mb = 0; mb < M / 16; ++mb) {
      const uint32_t* a = A + mb * 16 * K2;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t k = 0; k < K2; k += 16) {
        const uint32_t* r = w + k * 16;
        _tile_loadd(4, a + k, K2 * 4);
        _tile_loadd(5, r, 64); _tile_loadd(6, r + st, 64); _tile_loadd(7, r + 2 * st, 64);
        _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 6); _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, r + 3 * st, 64); _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(0, C, 256); _tile_stored(1, C + 16, 256); _tile_stored(2, C + 32, 256); _tile_stored(3, C + 48, 256);
    }
  }
}
// 2x2: rows mb, mb+1 x panels q, q+1
__attribute__((noinline)) void g22(const uint32_t* A, int64_t M, int64_t K2, const uint32_t* B, int64_t np, float* C) {
  for (int64_t q = 0; q < np; q += 2) {
    const uint32_t* w = B + q * K2 * 16; const int64_t st = K2 * 16;
    for (int64_t mb = 0; mb < M / 16; mb += 2) {
      const uint32_t* a = A + mb * 16 * K2;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t k = 0; k < K2; k += 16) {
        const uint32_t* r = w + k * 16;
        _tile_loadd(4, a + k, K2 * 4);
        _tile_loadd(5, r, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, r + st, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, a + 16 * K2 + k, K2 * 4);
        _tile_dpbf16ps(2, 7, 5);
        _tile_dpbf16ps(3, 7, 6);
      }
      _tile_stored(0, C, 256); _tile_stored(1, C + 16, 256); _tile_stored(2, C + 32, 256); _tile_stored(3, C + 48, 256);
    }
  }
}
// k-chunked: B chunk (4 panels x KC pairs) stays in L1 while all row blocks pass; C partials stored/loaded
__attribute__((noinline)) void gkc(const uint32_t* A, int64_t M, int64_t K2, const uint32_t* B, int64_t np, float* C, float* Cp, int64_t KC) {
  for (int64_t q = 0; q < np; q += 4) {
    const uint32_t* w = B + q * K2 * 16; const int64_t st = K2 * 16;
    for (int64_t k0 = 0; k0 < K2; k0 += KC) {
      for (int64_t mb = 0; mb < M / 16; ++mb) {
        const uint32_t* a = A + mb * 16 * K2;
        float* cp = Cp + mb * 16 * 64;
        if (k0 == 0) { _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3); }
        else { _tile_loadd(0, cp, 256); _tile_loadd(1, cp + 16, 256); _tile_loadd(2, cp + 32, 256); _tile_loadd(3, cp + 48, 256); }
        for (int64_t k = k0; k < k0 + KC; k += 16) {
          const uint32_t* r = w + k * 16;
          _tile_loadd(4, a + k, K2 * 4);
          _tile_loadd(5, r, 64); _tile_dpbf16ps(0, 4, 5);
          _tile_loadd(6, r + st, 64); _tile_dpbf16ps(1, 4, 6);
          _tile_loadd(5, r + 2 * st, 64); _tile_dpbf16ps(2, 4, 5);
          _tile_loadd(6, r + 3 * st, 64); _tile_dpbf16ps(3, 4, 6);
        }
        _tile_stored(0, cp, 256); _tile_stored(1, cp + 16, 256); _tile_stored(2, cp + 32, 256); _tile_stored(3, cp + 48, 256);
      }
    }
  }
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg cfg; _tile_loadconfig(&cfg);
  int64_t M = 256, K2 = atoi(argv[1]), N = 192 * 16 / 4; // np panels
  int64_t np = atoi(argv[2]);
  std::vector<uint32_t> A(M * K2), B(np * K2 * 16);
  for (auto& x : A) x = 0x3f803f80; for (auto& x : B) x = 0x3f803f80;
  std::vector<float> C(16 * 64), Cp(M * 64);
  double flop = 2.0 * M * (np * 16) * (K2 * 2);
  for (int v = 0; v < 5; ++v) {
    double best = 1e9;
    for (int rep = 0; rep < 20; ++rep) {
      double t0 = now();
      if (v == 0) g14(A.data(), M, K2, B.data(), np, C.data());
      if (v == 1) g14r(A.data(), M, K2, B.data(), np, C.data());
      if (v == 2) g22(A.data(), M, K2, B.data(), np, C.data());
      if (v == 3) gkc(A.data(), M, K2, B.data(), np, C.data(), Cp.data(), 64);
      if (v == 4) gkc(A.data(), M, K2, B.data(), np, C.data(), Cp.data(), 32);
      double t = now() - t0; if (t < best) best = t;
    }
    const char* nm[] = {"1x4", "1x4 3B", "2x2", "kchunk64", "kchunk32"};
    printf("%-10s K2=%ld np=%ld  %.0f GFLOP/s\n", nm[v], (long)K2, (long)np, flop / best / 1e9);
  }
  _tile_release();
}
