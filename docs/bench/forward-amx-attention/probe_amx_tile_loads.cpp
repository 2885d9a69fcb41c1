#include <immintrin.h>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <chrono>
#include <vector>
#include <unistd.h>
#include <sys/syscall.h>
struct Cfg { uint8_t palette=1, start_row=0; uint8_t r[14]={}; uint16_t colsb[16]={}; uint8_t rows[16]={};
  Cfg(){ for(int t=0;t<8;++t){colsb[t]=64;rows[t]=16;} } };
static double now(){ return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  Cfg cfg; _tile_loadconfig(&cfg);
  std::vector<uint32_t> buf(64 * 1024, 0x3f803f80);
  const uint32_t* b = buf.data();
  const int64_t n = 1 << 20;
  for (int v = 0; v < 6; ++v) {
    double t0 = now();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, b, 64); _tile_loadd(5, b, 64); _tile_loadd(6, b, 64); _tile_loadd(7, b, 64);
    for (int64_t i = 0; i < n; ++i) {
      if (v == 1) { _tile_loadd(4, b, 64); }
      if (v == 2) { _tile_loadd(5, b + 256 * (i & 7), 64); }
      if (v == 3) { _tile_loadd(4, b + 256 * (i & 7), 64); _tile_loadd(5, b + 256 * ((i+1) & 7), 64); _tile_loadd(6, b + 256 * ((i+2) & 7), 64);}
      if (v == 4) { _tile_loadd(4, b, 1152); }
      if (v == 5) { _tile_loadd(5, b + 256 * (i & 7), 64); _tile_loadd(6, b + 256 * ((i+3) & 7), 64); }
      _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 6); _tile_dpbf16ps(2, 4, 5); _tile_dpbf16ps(3, 4, 6);
    }
    std::vector<float> c(256); _tile_stored(0, c.data(), 64);
    double t = now() - t0;
    const char* nm[] = {"no loads", "A load", "1 B load", "A+2B", "A strided", "2 B loads"};
    printf("%-10s %.0f GFLOP/s  %.1f cycles/TDP at 3GHz\n", nm[v], 4.0 * n * 16384 / t / 1e9, t * 3e9 / (4.0 * n));
  }
}
