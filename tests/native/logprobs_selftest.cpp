// Stand-alone check of the NEON build of the log-probability passes (csrc/sampling/logprobs_neon.cpp)
// against the portable build and against a binary128 reference, cross-compiled for arm64 and run
// under qemu by tests/test_kernels_neon.py. Exit status 0 = every check passed.
//
// What must hold (docs/sampling.md, "Log-probabilities"; u = 2^-53):
//  * the stats pass (finite count, max, min, every block maximum) equals the portable one exactly;
//  * each term exp(d), d in [-600, 0], is within kLogprobTermRel of exp in binary128 (long double
//    on aarch64 Linux, ~2^-112), and has exactly the bits of the fused one-lane model below (the
//    AVX2 / AVX-512 arithmetic: the NEON build promises those bits);
//  * the sum is within kLogprobSumRel of the binary128 sum of binary128 terms (relative; error
//    ~n 2^-113, far below u), within 2 kLogprobSumRel of the portable build's, and has exactly the
//    bits of the model of the AVX2 order (four lanes, 32 logits per step, a tree of eight, then
//    compensated lanes);
//  * the lse within kLogprobSumRel + 2u ln(S) + u |lse| of M + ln(S) in binary128 (plus 2^-100);
//  * the top-k ids equal the portable build's and a brute-force sort's exactly, and the lse the
//    top-k call returns equals finite_logsumexp's bit for bit (the collection must not change it).
// Shapes: seeded 129,280-entry vocabularies (language-model-like, flat, all equal, spread beyond
// the clamp, NaN/+-inf, around 1e4, many ties, +-0, 15 finite, none finite, an odd length) and
// every length 1..80 (the vector tails).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "quant/simd.h"
#include "sampling/logprobs.h"
#include "sampling/logprobs_kernels.h"
#include "selftest_rng.h"

using namespace ds4;
using namespace ds4::logprob_kernels;
using namespace selftest;

namespace {

static_assert(sizeof(long double) == 16 && std::numeric_limits<long double>::digits == 113,
              "the reference needs binary128 long double (aarch64 Linux)");

constexpr double kU = 0x1p-53;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kLn2Hi = 0x1.62e42fefa39efp-5;   // the fused builds' split of ln2/16 (facts)
constexpr double kLn2Lo = 0x1.abc9e3b39803fp-60;

int64_t g_checks = 0, g_failures = 0;
std::map<std::string, int64_t> g_failed;   // failures per check, summarised at the end

void check(bool ok, const char* what, const char* shape, double got, double want) {
    ++g_checks;
    if (ok) return;
    g_failed[what]++;
    if (++g_failures <= 20) std::printf("FAIL %s [%s]: got %.17g want %.17g\n", what, shape, got, want);
}

uint64_t bits(double v) {
    uint64_t b;
    std::memcpy(&b, &v, 8);
    return b;
}

double from_bits(uint64_t b) {
    double v;
    std::memcpy(&v, &b, 8);
    return v;
}

// One lane of the fused builds' exponential, written with std::fma (FMADD on aarch64).
double model_exp(double d) {
    if (!(d >= kClamp)) d = kClamp;   // FMAXNM / x86 max: a NaN counts as the clamp
    const double kshift = std::fma(d, kInvLn2_16, kShifter);
    const double k = kshift - kShifter;
    double r = std::fma(-k, kLn2Hi, d);
    r = std::fma(-k, kLn2Lo, r);
    double h = std::fma(kC[6], r, kC[5]);
    for (int i = 4; i >= 0; --i) h = std::fma(h, r, kC[i]);
    const uint64_t kb = bits(kshift);
    const double t = from_bits(kTable[kb & 15] + (kb << 48));
    return std::fma(t * r, h, t);
}

void two_sum(double& s, double& c, double x) {
    const double t = s + x;
    const double z = t - s;
    c += (s - (t - z)) + (x - z);
    s = t;
}

// The AVX2 build's summation order with the model's terms (logprobs_avx2.cpp): lane L of step i
// adds the logits i + 4m + L, m = 0..7, as a tree; the tail 8 at a time, i + L and i + 4 + L.
double model_sum(const float* a, int64_t n, float m) {
    auto w = [&](int64_t j) { return j < n && a[j] - a[j] == 0.0f ? model_exp((double)a[j] - (double)m) : 0.0; };
    double s[4] = {0, 0, 0, 0}, c[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int L = 0; L < 4; ++L)
            two_sum(s[L], c[L], ((w(i + L) + w(i + 4 + L)) + (w(i + 8 + L) + w(i + 12 + L))) +
                                    ((w(i + 16 + L) + w(i + 20 + L)) + (w(i + 24 + L) + w(i + 28 + L))));
    for (; i < n; i += 8)
        for (int L = 0; L < 4; ++L) two_sum(s[L], c[L], w(i + L) + w(i + 4 + L));
    double total = s[0], comp = c[0];
    for (int L = 1; L < 4; ++L) {
        const double t = total + s[L];
        const double z = t - total;
        comp += ((total - (t - z)) + (s[L] - z)) + c[L];
        total = t;
    }
    return total + comp;
}

// ---- the per-term exponential ------------------------------------------------------------------

void check_terms() {
    std::vector<double> d;
    const double ln2_16 = 0.043321698784996581;   // ln2/16, for the reduction's edges
    for (int i = 0; i < 1000; ++i) d.push_back(-600.0 * uniform());
    for (int i = 0; i < 1000; ++i) d.push_back(-uniform());
    for (int i = 0; i < 1000; ++i) d.push_back(std::log(uniform() + 1e-300) * 5.0);
    for (int i = 0; i < 1000; ++i) {
        const double k = -(double)below(13851);
        d.push_back(k * ln2_16 + (uniform() - 0.5) * 2e-12);   // |r| near 0
        d.push_back((k - 0.5) * ln2_16);                       // |r| near ln2/32
    }
    for (double v : {0.0, -0.0, -600.0, -1e-300, -5e-324, -ln2_16 / 2, -599.9999999999999})
        d.push_back(v);
    for (double& v : d) v = std::min(0.0, std::max(-600.0, v));
    std::vector<double> neon(d.size()), gen(d.size()), api(d.size());
    exp_neon(d.data(), neon.data(), (int64_t)d.size());
    exp_generic(d.data(), gen.data(), (int64_t)d.size());
    set_simd_path(SimdPath::NEON);
    logprob_exp(d.data(), api.data(), (int64_t)d.size());
    double worst = 0, worst_gen = 0;
    int64_t differ = 0;
    for (size_t i = 0; i < d.size(); ++i) {
        const long double ref = std::exp((long double)d[i]);
        const double err = (double)(std::fabs((long double)neon[i] - ref) / ref);
        const double err_gen = (double)(std::fabs((long double)gen[i] - ref) / ref);
        worst = std::max(worst, err), worst_gen = std::max(worst_gen, err_gen);
        check(err <= kLogprobTermRel, "term within kLogprobTermRel", "exp", neon[i], (double)ref);
        check(err_gen <= kLogprobTermRel, "portable term within kLogprobTermRel", "exp", gen[i], (double)ref);
        check(bits(neon[i]) == bits(model_exp(d[i])), "term == fused model, bit for bit", "exp", neon[i], model_exp(d[i]));
        check(bits(api[i]) == bits(neon[i]), "logprob_exp on the neon path == exp_neon", "exp", api[i], neon[i]);
        differ += bits(neon[i]) != bits(gen[i]);
    }
    // Outside the domain the fused builds agree too: NaN, -inf and anything below the clamp
    // give exp(kClamp) (the x86 max returns its second operand; FMAXNM the number).
    const double odd[4] = {std::nan(""), -std::numeric_limits<double>::infinity(), -1e308, -600.5};
    double odd_out[4];
    exp_neon(odd, odd_out, 4);
    for (int i = 0; i < 4; ++i)
        check(bits(odd_out[i]) == bits(model_exp(kClamp)), "NaN / -inf / below the clamp give exp(kClamp)", "exp",
              odd_out[i], model_exp(kClamp));
    // The portable build is another evaluation (no FMA): if no term differed, the NEON one was
    // not the one measured.
    check(differ > 0, "neon and portable terms differ somewhere", "exp", (double)differ, 1);
    std::printf("terms: %zu arguments, worst %.3f u (portable %.3f u), %lld differ from the portable bits\n",
                d.size(), worst / kU, worst_gen / kU, (long long)differ);
}

// ---- the whole-vocabulary passes ----------------------------------------------------------------

struct Ref {
    long double sum = 0;   // over the finite logits of exp(max(l - M, -600)), binary128
    float max = -kInf;
    int64_t n_finite = 0;
};

Ref reference(const std::vector<float>& a) {
    Ref r;
    for (float v : a)
        if (v - v == 0.0f) r.n_finite++, r.max = std::max(r.max, v);
    for (float v : a)
        if (v - v == 0.0f) r.sum += std::exp(std::max((long double)((double)v - (double)r.max), (long double)kClamp));
    return r;
}

std::vector<int32_t> brute_top(const std::vector<float>& a, int64_t k) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < a.size(); ++i)
        if (a[i] - a[i] == 0.0f) ids.push_back((int32_t)i);
    std::sort(ids.begin(), ids.end(), [&](int32_t x, int32_t y) { return a[x] > a[y] || (a[x] == a[y] && x < y); });
    ids.resize((size_t)std::min<int64_t>(k, (int64_t)ids.size()));
    return ids;
}

void check_shape(const char* name, const std::vector<float>& a, const std::vector<int64_t>& ks) {
    const int64_t n = (int64_t)a.size();
    const Ref ref = reference(a);
    std::vector<float> bm_neon((size_t)(n / kBlock + 2)), bm_gen(bm_neon.size());
    const Stats sn = stats_neon(a.data(), n, bm_neon.data()), sg = stats_generic(a.data(), n, bm_gen.data());
    check(sn.n_finite == sg.n_finite && sn.n_finite == ref.n_finite, "stats: finite count", name, (double)sn.n_finite, (double)sg.n_finite);
    check(sn.max == sg.max && sn.max == ref.max, "stats: max", name, sn.max, sg.max);
    check(sn.min == sg.min, "stats: min", name, sn.min, sg.min);
    int64_t bad_blocks = 0;
    for (int64_t b = 0; b * kBlock < n; ++b) bad_blocks += !(bm_neon[b] == bm_gen[b]);
    check(bad_blocks == 0, "stats: block maxima", name, (double)bad_blocks, 0);

    if (ref.n_finite > 0) {
        const bool plain = sg.n_finite == n && (double)sg.min - (double)sg.max >= kClamp;
        const double neon = exp_sum_neon(a.data(), n, sg.max, plain, nullptr);
        const double gen = exp_sum_generic(a.data(), n, sg.max, plain, nullptr);
        const double model = model_sum(a.data(), n, sg.max);
        const long double s = ref.sum;
        check(bits(neon) == bits(model), "sum == model of the AVX2 order, bit for bit", name, neon, model);
        check(std::fabs(neon - s) <= kLogprobSumRel * s, "sum within kLogprobSumRel", name, neon, (double)s);
        check(std::fabs(gen - s) <= kLogprobSumRel * s, "portable sum within kLogprobSumRel", name, gen, (double)s);
        check(std::fabs(neon - gen) <= 2 * kLogprobSumRel * s, "sum within 2 kLogprobSumRel of portable", name, neon, gen);
        if (plain) {   // the masked variant must give the same bits on a plain vocabulary
            const double masked = exp_sum_neon(a.data(), n, sg.max, false, nullptr);
            check(bits(masked) == bits(neon), "masked sum == plain sum", name, masked, neon);
        }
        set_simd_path(SimdPath::NEON);
        const double api = finite_exp_sum(a.data(), n);
        check(bits(api) == bits(neon), "finite_exp_sum on the neon path == exp_sum_neon", name, api, neon);
        double lse = 0;
        check(finite_logsumexp(a.data(), n, &lse), "finite_logsumexp: some finite", name, 0, 1);
        const long double want = (long double)ref.max + std::log(s);
        const double bound = kLogprobSumRel + 2 * kU * std::log((double)s) + kU * std::fabs(lse) + 0x1p-100;
        check(std::fabs(lse - want) <= bound, "lse within its bound", name, lse, (double)want);
        set_simd_path(SimdPath::Scalar);
        const double api_gen = finite_exp_sum(a.data(), n);
        check(bits(api_gen) == bits(gen), "finite_exp_sum on the scalar path == exp_sum_generic", name, api_gen, gen);
    } else {
        set_simd_path(SimdPath::NEON);
        double lse = 1.0;
        check(!finite_logsumexp(a.data(), n, &lse) && lse == 1.0, "no finite logit: false, lse untouched", name, lse, 1);
        check(finite_exp_sum(a.data(), n) == 0.0, "no finite logit: sum 0", name, 0, 0);
    }

    for (int64_t k : ks) {
        const std::vector<int32_t> want = brute_top(a, k);
        std::vector<int32_t> neon((size_t)std::min(k, n) + 1, -7), gen = neon;
        double lse_neon = 0, lse_gen = 0, lse_plain = 0;
        set_simd_path(SimdPath::NEON);
        const int64_t cn = top_finite_logits(a.data(), n, k, neon.data(), &lse_neon);
        const bool has = finite_logsumexp(a.data(), n, &lse_plain);
        std::vector<int32_t> alone = neon;
        const int64_t ca = top_finite_logits(a.data(), n, k, alone.data());   // no lse: its own pass
        set_simd_path(SimdPath::Scalar);
        const int64_t cg = top_finite_logits(a.data(), n, k, gen.data(), &lse_gen);
        check(cn == (int64_t)want.size() && cg == cn && ca == cn, "top-k count", name, (double)cn, (double)want.size());
        bool same = cn == (int64_t)want.size() && cg == cn && ca == cn;
        for (int64_t i = 0; same && i < cn; ++i) same = neon[i] == want[i] && gen[i] == want[i] && alone[i] == want[i];
        check(same, "top-k ids == portable == brute force", name, (double)k, 0);
        if (has) {
            check(bits(lse_neon) == bits(lse_plain), "top-k lse == finite_logsumexp's, bit for bit", name, lse_neon, lse_plain);
        } else {
            check(std::isnan(lse_neon) && std::isnan(lse_gen), "top-k lse NaN without finite logits", name, lse_neon, NAN);
        }
    }
}

std::vector<float> vocab(const char* kind, int64_t n) {
    std::vector<float> a((size_t)n);
    const std::string k = kind;
    for (auto& v : a) v = normal();
    if (k == "peaked") {
        for (auto& v : a) v *= 2;
        for (int i = 0; i < 40; ++i) a[(size_t)below(n)] += (float)(6 + 8 * uniform());
    } else if (k == "flat") {
        for (auto& v : a) v *= 3;
    } else if (k == "equal") {
        std::fill(a.begin(), a.end(), 1.5f);
    } else if (k == "wide") {
        for (auto& v : a) v = (float)(-2000 + 2040 * uniform());
    } else if (k == "specials") {
        for (auto& v : a) v = 3 + 4 * v;
        for (int i = 0; i < 3000; ++i) a[(size_t)below(n)] = i % 3 == 0 ? NAN : i % 3 == 1 ? kInf : -kInf;
    } else if (k == "large") {
        for (auto& v : a) v = 1e4f + 3 * v;
    } else if (k == "ties") {
        for (auto& v : a) v = (float)(below(11) - 5);
    } else if (k == "zeros") {
        for (auto& v : a) v = below(2) ? 0.0f : -0.0f;
        a[(size_t)below(n)] = -1.0f;
    } else if (k == "sparse") {
        std::fill(a.begin(), a.end(), -kInf);
        for (int i = 0; i < 15; ++i) a[(size_t)below(n)] = normal();
    } else if (k == "none") {
        for (auto& v : a) v = below(3) == 0 ? NAN : below(2) ? kInf : -kInf;
    } else if (k == "tiny") {   // a few logits, specials and ties mixed in
        for (auto& v : a) {
            const int64_t c = below(10);
            v = c == 0 ? NAN : c == 1 ? kInf : c == 2 ? -kInf : c == 3 ? 2.0f : c == 4 ? -700.0f : v;
        }
    }
    return a;
}

// Cross-architecture mode (tests/test_kernels_neon.py compares with the x86 AVX2 build, which
// must have the same bits): "--vocab FILE..." prints, per file of float32 logits, the NEON path's
// sum and lse bits and its top 20 ids; "--exp IN OUT" writes logprob_exp of IN's doubles to OUT.
int cross_arch(int argc, char** argv) {
    set_simd_path(SimdPath::NEON);
    auto read = [](const char* path) {
        std::vector<char> bytes;
        if (FILE* f = std::fopen(path, "rb")) {
            char buf[65536];
            for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.insert(bytes.end(), buf, buf + got);
            std::fclose(f);
        }
        return bytes;
    };
    if (std::strcmp(argv[1], "--exp") == 0 && argc == 4) {
        const std::vector<char> in = read(argv[2]);
        std::vector<double> d(in.size() / 8), out(d.size());
        std::memcpy(d.data(), in.data(), d.size() * 8);
        logprob_exp(d.data(), out.data(), (int64_t)d.size());
        FILE* f = std::fopen(argv[3], "wb");
        if (!f || std::fwrite(out.data(), 8, out.size(), f) != out.size()) return 2;
        std::fclose(f);
        return 0;
    }
    for (int i = 2; i < argc; ++i) {
        const std::vector<char> in = read(argv[i]);
        std::vector<float> a(in.size() / 4);
        std::memcpy(a.data(), in.data(), a.size() * 4);
        const int64_t n = (int64_t)a.size();
        std::vector<int32_t> ids(20);
        double lse = 0;
        const int64_t got = top_finite_logits(a.data(), n, 20, ids.data(), &lse);
        std::printf("vocab %s sum %016llx lse %016llx ids", argv[i], (unsigned long long)bits(finite_exp_sum(a.data(), n)),
                    (unsigned long long)bits(lse));
        for (int64_t j = 0; j < got; ++j) std::printf("%s%d", j ? "," : " ", ids[(size_t)j]);
        std::printf("\n");
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc > 2) return cross_arch(argc, argv);
    bool have_neon = false;
    for (SimdPath p : available_simd_paths()) have_neon |= p == SimdPath::NEON;
    if (!have_neon) {
        std::printf("neon path not available on this CPU: nothing to check\n");
        return 1;
    }
    std::printf("neon path available\n");
    check_terms();
    const int64_t v = 129280;
    const std::vector<int64_t> ks = {1, 20, 257, 5000};
    for (const char* kind : {"peaked", "flat", "equal", "wide", "specials", "large", "ties", "zeros", "sparse"})
        check_shape(kind, vocab(kind, v), ks);
    check_shape("odd", vocab("flat", v - 37), ks);
    check_shape("none", vocab("none", 1000), {1, 20});
    for (int64_t n = 1; n <= 80; ++n) check_shape("tiny", vocab("tiny", n), {1, 3, 20});
    for (const auto& f : g_failed) std::printf("failed %lld x: %s\n", (long long)f.second, f.first.c_str());
    std::printf("logprobs: %lld checks, %lld failures\n", (long long)g_checks, (long long)g_failures);
    return g_failures == 0 ? 0 : 1;
}
