"""Copy nld_cpu.cpp with rdtsc counters around attention's parts, printed every 300 layer calls.

Usage: ``python instrument.py SRC.cpp OUT.cpp``; then ``SRC=OUT.cpp python loop64.py ...``. The anchors
are fce35eb's source lines (and this change's); the counters are shared atomics, which add a little.
"""

import sys

src, dst = sys.argv[1], sys.argv[2]
s=open(src).read()
s=s.replace("Pool* g_pool = nullptr;", "Pool* g_pool = nullptr;\nstd::atomic<uint64_t> g_sec[10];\ninline uint64_t rdtsc_() { return __rdtsc(); }",1)
reps=[("""        const int64_t t1 = std::min(len, t0 + kChunk), nt = t1 - t0, nq = nt * group;""","""        uint64_t c0 = rdtsc_();
        const int64_t t1 = std::min(len, t0 + kChunk), nt = t1 - t0, nq = nt * group;"""),
("""        prefetch_l2(vslot, std::min<int64_t>(P, kValueAheadRows) * hd_ * static_cast<int64_t>(sizeof(CT)));""","""        uint64_t c1 = rdtsc_(); g_sec[0] += c1 - c0;
        prefetch_l2(vslot, std::min<int64_t>(P, kValueAheadRows) * hd_ * static_cast<int64_t>(sizeof(CT)));
        uint64_t c2 = rdtsc_(); g_sec[1] += c2 - c1;"""),
("""        score_panels(qb.data(), nq, kn, jmax, sc.data() + P, S16);""","""        uint64_t c3 = rdtsc_(); g_sec[2] += c3 - c2;
        score_panels(qb.data(), nq, kn, jmax, sc.data() + P, S16);
        uint64_t c4 = rdtsc_(); g_sec[3] += c4 - c3;"""),
("""        const float* vnew = qkv + base * W + Voff + g * hd_;""","""        uint64_t c5 = rdtsc_(); g_sec[4] += c5 - c4;
        const float* vnew = qkv + base * W + Voff + g * hd_;"""),
("""        for (int64_t qi = 0; qi < nq; ++qi)
          std::memcpy(out + (base + t0 + qi / group) * Q + (g * group + qi % group) * hd_, acc.data() + qi * hd_,
                      sizeof(float) * hd_);
      }
    });""","""        uint64_t c6 = rdtsc_(); g_sec[5] += c6 - c5;
        for (int64_t qi = 0; qi < nq; ++qi)
          std::memcpy(out + (base + t0 + qi / group) * Q + (g * group + qi % group) * hd_, acc.data() + qi * hd_,
                      sizeof(float) * hd_);
        g_sec[6] += rdtsc_() - c6; g_sec[7] += 1;
      }
    });
    g_sec[8] += rdtsc_() - a0;
    static int64_t calls = 0;
    if (++calls % 300 == 0) {
      fprintf(stderr, "items %lu per item cycles: setup %.0f pf %.0f kscore %.0f nscore %.0f softmax %.0f pv %.0f out %.0f | pre %.0f wall/item %.0f\\n",
        (unsigned long)g_sec[7].load(), 1.0*g_sec[0]/g_sec[7], 1.0*g_sec[1]/g_sec[7], 1.0*g_sec[2]/g_sec[7], 1.0*g_sec[3]/g_sec[7], 1.0*g_sec[4]/g_sec[7], 1.0*g_sec[5]/g_sec[7], 1.0*g_sec[6]/g_sec[7], 1.0*g_sec[9]/g_sec[7], 1.0*g_sec[8]/g_sec[7]);
      for (auto& x : g_sec) x = 0;
    }"""),
("""    const CT* kc = static_cast<const CT*>(k_cache_[li].data_ptr());""","""    const uint64_t a0 = rdtsc_();
    const CT* kc = static_cast<const CT*>(k_cache_[li].data_ptr());"""),
("""    par_items(n_items, work / std::max<int64_t>(n_items, 1), [&](int64_t ib, int64_t ie) {""","""    g_sec[9] += rdtsc_() - a0;
    par_items(n_items, work / std::max<int64_t>(n_items, 1), [&](int64_t ib, int64_t ie) {""")]
for a, b in reps:
    assert a in s, a
    s = s.replace(a, b)
open(dst,'w').write(s)
