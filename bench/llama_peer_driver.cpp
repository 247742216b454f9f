// Timing driver for bench/llama_peer.py: runs llama.cpp (libllama) on the exact token ids the ds4
// side gets, the way bench/llama_peer.py times ds4, and prints one JSON object on stdout.
//
//   llama_peer_driver MODEL IDS THREADS CTX FA PREFILLS DECODE WARMUP [LOGITS_OUT]
//
// IDS is a file of little-endian int32 token ids; PREFILLS a comma list of prompt lengths (each a
// prefix of IDS, each on an empty context, logits for the last position only); DECODE greedy steps
// are timed after the first prefill, each step being one llama_decode plus the argmax that picks the
// next token. WARMUP tokens are evaluated (and cleared) first so page faults of the mapped weights
// and one-off allocations are not timed. FA is 1 (flash attention on) or 0 (off). LOGITS_OUT, if
// given, receives the float32 logits of the first prompt's last position (to compare engines).
//
// Built by bench/_llama_cpp.py against the llama.cpp copy inside the llama-cpp-python sdist.
//
// Debugging the agreement of the engines (docs/llama-peer.md): with LLAMA_PEER_DUMP=DIR set, every
// F32 graph tensor whose name (llama.cpp's "<what>-<layer>") starts with one of the comma-separated
// prefixes in LLAMA_PEER_DUMP_NAMES (default "attn_out-,ffn_out-") is appended, as raw float32, to
// DIR/<name>.f32 each time the graph computes it (one row of ne0 floats per token).

#include "llama.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

double now_s() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "llama_peer_driver: %s\n", msg.c_str());
    std::exit(2);
}

std::vector<llama_token> read_ids(const char * path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) die(std::string("cannot open ids file ") + path);
    std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bytes.size() % 4) die(std::string("ids file is not a whole number of int32: ") + path);
    std::vector<llama_token> ids(bytes.size() / 4);
    std::memcpy(ids.data(), bytes.data(), bytes.size());
    return ids;
}

int argmax(const float * x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i) {
        if (x[i] > x[best]) best = i;
    }
    return best;
}

// Evaluate ids[0, n) at positions pos0.. with logits for the last token only; returns seconds.
double eval(llama_context * ctx, const llama_token * ids, int n, int pos0) {
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i] = ids[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = i == n - 1;
    }
    b.n_tokens = n;
    const double t0 = now_s();
    const int rc = llama_decode(ctx, b);
    const double dt = now_s() - t0;
    llama_batch_free(b);
    if (rc != 0) die("llama_decode failed with code " + std::to_string(rc));
    return dt;
}

// A "key: N kB" line of a /proc/self file, in bytes; 0 where unavailable.
long long proc_kb_bytes(const char* proc_file, const std::string& key) {
    std::ifstream f(proc_file);
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind(key + ":", 0) == 0) return std::atoll(line.c_str() + key.size() + 1) * 1024;
    }
    return 0;
}

// This process's peak resident set (VmHWM). Read here rather than from the parent's wait4 rusage:
// Linux carries the forking parent's high-water mark over into the child's ru_maxrss.
long long peak_rss_bytes() { return proc_kb_bytes("/proc/self/status", "VmHWM"); }

// Bytes of this process's file maps backed by 2 MiB page-table entries (FilePmdMapped): whether
// the weights were read through huge pages.
long long file_huge_bytes() { return proc_kb_bytes("/proc/self/smaps_rollup", "FilePmdMapped"); }

struct TensorDump {
    std::string dir;
    std::vector<std::string> prefixes;

    bool wants(const ggml_tensor * t) const {
        if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return false;
        for (const std::string & p : prefixes) {
            if (std::strncmp(t->name, p.c_str(), p.size()) == 0) return true;
        }
        return false;
    }
};

// ggml's scheduler asks first (ask = true: do we want this node?) and calls again once it is computed.
bool dump_tensor(ggml_tensor * t, bool ask, void * user) {
    const TensorDump & d = *static_cast<const TensorDump *>(user);
    if (ask) return d.wants(t);
    if (!d.wants(t)) return true;
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, buf.size() * sizeof(float));
    const std::string path = d.dir + "/" + t->name + ".f32";
    std::FILE * f = std::fopen(path.c_str(), "ab");
    if (!f || std::fwrite(buf.data(), sizeof(float), buf.size(), f) != buf.size()) die("cannot write " + path);
    std::fclose(f);
    return true;
}

std::vector<std::string> split_names(const char * s) {
    std::vector<std::string> out;
    std::string cur;
    for (const char * p = s;; ++p) {
        if (*p == ',' || *p == '\0') {
            if (!cur.empty()) out.push_back(cur);
            cur.clear();
            if (*p == '\0') break;
        } else {
            cur += *p;
        }
    }
    return out;
}

std::vector<int> parse_list(const char * s) {
    std::vector<int> out;
    for (const std::string & x : split_names(s)) out.push_back(std::atoi(x.c_str()));
    return out;
}

void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 9 && argc != 10) die("usage: llama_peer_driver MODEL IDS THREADS CTX FA PREFILLS DECODE WARMUP [LOGITS_OUT]");
    const char * logits_out = argc == 10 ? argv[9] : nullptr;
    const char * model_path = argv[1];
    const std::vector<llama_token> ids = read_ids(argv[2]);
    const int threads = std::atoi(argv[3]);
    const int n_ctx = std::atoi(argv[4]);
    const bool fa = std::atoi(argv[5]) != 0;
    const std::vector<int> prefills = parse_list(argv[6]);
    const int n_decode = std::atoi(argv[7]);
    const int n_warmup = std::atoi(argv[8]);
    if (prefills.empty()) die("no prefill lengths");
    int n_batch = n_warmup;
    for (int n : prefills) {
        if (n < 1 || n > (int) ids.size()) die("prefill length " + std::to_string(n) + " outside the ids file");
        if (n > n_batch) n_batch = n;
    }
    if (prefills[0] + n_decode > n_ctx) die("first prefill + decode steps exceed ctx");

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    const double t_load = now_s();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) die(std::string("cannot load model ") + model_path);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;  // a whole prompt per llama_decode call; n_ubatch stays llama.cpp's default
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.no_perf = true;
    TensorDump dump;
    if (const char * dir = std::getenv("LLAMA_PEER_DUMP")) {
        const char * names = std::getenv("LLAMA_PEER_DUMP_NAMES");
        dump.dir = dir;
        dump.prefixes = split_names(names ? names : "attn_out-,ffn_out-");
        cp.cb_eval = dump_tensor;
        cp.cb_eval_user_data = &dump;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a context");
    const double load_s = now_s() - t_load;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_memory_t mem = llama_get_memory(ctx);

    if (n_warmup > 0) {
        eval(ctx, ids.data(), n_warmup, 0);
        llama_memory_clear(mem, true);
    }

    std::string prefill_json;
    std::vector<double> step_s;
    std::vector<int> decoded;
    for (size_t k = 0; k < prefills.size(); ++k) {
        const int n = prefills[k];
        llama_memory_clear(mem, true);
        const double dt = eval(ctx, ids.data(), n, 0);
        const int top = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s\"%d\": {\"seconds\": %.6f, \"argmax\": %d}", k ? ", " : "", n, dt, top);
        prefill_json += buf;
        if (k == 0 && logits_out) {
            std::FILE * f = std::fopen(logits_out, "wb");
            if (!f || std::fwrite(llama_get_logits_ith(ctx, -1), sizeof(float), n_vocab, f) != (size_t) n_vocab) {
                die(std::string("cannot write ") + logits_out);
            }
            std::fclose(f);
        }
        if (k == 0) {  // greedy decode continues the first prompt
            llama_token tok = top;
            for (int i = 0; i < n_decode; ++i) {
                decoded.push_back(tok);
                const double t0 = now_s();
                eval(ctx, &tok, 1, n + i);
                tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
                step_s.push_back(now_s() - t0);
            }
        }
    }

    std::printf("{\"load_seconds\": %.6f, \"n_batch\": %u, \"n_ubatch\": %u, \"flash_attn\": %s, \"prefill\": {%s}, ",
                load_s, llama_n_batch(ctx), llama_n_ubatch(ctx), fa ? "true" : "false", prefill_json.c_str());
    std::printf("\"decode_step_seconds\": [");
    for (size_t i = 0; i < step_s.size(); ++i) std::printf("%s%.6f", i ? ", " : "", step_s[i]);
    std::printf("], \"decode_tokens\": [");
    for (size_t i = 0; i < decoded.size(); ++i) std::printf("%s%d", i ? ", " : "", decoded[i]);
    std::printf("], \"peak_rss_bytes\": %lld, \"file_huge_bytes\": %lld}\n", peak_rss_bytes(), file_huge_bytes());

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
