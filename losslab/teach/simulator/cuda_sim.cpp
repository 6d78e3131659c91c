// The simulator's scheduler: blocks one after another, each block's threads as fibers
// (cuda_sim.h says what is modelled and what is checked).
#include "cuda_sim.h"

#include <cstdarg>
#include <string>
#include <unordered_map>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

// ---- fiber contexts: a hand-written switch on x86-64 (no system call, no sanitizer
// interceptor: ucontext's swapcontext costs two sigprocmask calls a switch), ucontext elsewhere.
#if defined(__x86_64__) && !defined(CUDA_SIM_UCONTEXT)
extern "C" void cuda_sim_switch(void** save_sp, void* load_sp);
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack and
// the stack pointer in *save_sp, then restores the same from load_sp.
asm(R"(
    .text
    .globl cuda_sim_switch
    .type cuda_sim_switch, @function
cuda_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuda_sim_switch, .-cuda_sim_switch
)");

namespace cuda_sim {
namespace {
struct Context { void* sp = nullptr; };

// A new context whose first switch "returns" into entry with the stack aligned as after a call.
void context_init(Context& c, char* stack, size_t size, void (*entry)()) {
    auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15));
    top[-1] = 0;                                      // entry's return address: none (ends backtraces)
    top[-2] = reinterpret_cast<uint64_t>(entry);      // where the switch's ret goes
    for (int k = 3; k <= 8; ++k) top[-k] = 0;         // rbp (0 ends frame-pointer walks), rbx, r12-r15
    top[-9] = 0x1F80u | (uint64_t(0x037Fu) << 32);    // default MXCSR, x87 control word
    c.sp = top - 9;
}
void context_switch(Context& from, Context& to) { cuda_sim_switch(&from.sp, to.sp); }
}  // namespace
}  // namespace cuda_sim
#else
namespace cuda_sim {
namespace {
struct Context { ucontext_t uc; };
void context_init(Context& c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
    // AddressSanitizer's swapcontext clears the shadow of the whole target stack on every
    // switch; the fiber annotations make that needless.
    c.uc.uc_stack.ss_sp = nullptr;
    c.uc.uc_stack.ss_size = 0;
}
void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
}  // namespace
}  // namespace cuda_sim
#endif

uint3 threadIdx{0, 0, 0}, blockIdx{0, 0, 0};
dim3 blockDim, gridDim;

namespace cuda_sim {
namespace {

enum class State { runnable, at_barrier, at_warp, done };

struct Fiber {
    Context ctx;
    State state = State::done;
    uint3 tid{0, 0, 0};
    void* fake_stack = nullptr;  // AddressSanitizer's bookkeeping for the fiber switch
    uint64_t result = 0;         // what the last warp collective gave this lane
};

struct WarpPending {  // the collective a warp's lanes are gathering at
    bool active = false;
    Op op = Op::sync;
    const char* name = "";
    const char* file = "";
    int line = 0;
    unsigned mask = 0, arrived = 0;
    int width = 32;
    uint64_t in[32] = {};
    int arg[32] = {};
};

constexpr size_t STACK = 256 * 1024;  // per fiber; sanitizer frames are large
constexpr int MAX_THREADS = 1024;

std::vector<Fiber> fibers;
std::vector<WarpPending> warps;
char* stacks = nullptr;
Context scheduler;
void* scheduler_fake_stack = nullptr;
const void* main_stack_bottom = nullptr;
size_t main_stack_size = 0;
int current = -1;
int live = 0;
int barrier_waiting = 0;
const char* barrier_file = "";
int barrier_line = 0;
void (*body_fn)(void*) = nullptr;
void* body_arg = nullptr;
const char* kernel_name = "";
std::vector<char> dynamic_smem;
bool reverse_order = false;
struct SharedRegion { void* start; size_t bytes; const char* name; };
std::vector<SharedRegion> shared_regions;  // the __shared__ objects seen so far
uint64_t epoch = 0;                        // barrier intervals: a block's start, each barrier's release
struct Update { uint64_t epoch; int thread; };
std::unordered_map<const void*, Update> updates;  // each shared element's last update this block

void start_switch(void** save, const void* bottom, size_t size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(save, bottom, size);
#else
    (void)save, (void)bottom, (void)size;
#endif
}

void finish_switch(void* save, const void** bottom, size_t* size) {
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(save, bottom, size);
#else
    (void)save, (void)bottom, (void)size;
#endif
}

char* stack_of(int i) { return stacks + size_t(i) * STACK; }

void json_string(std::string& out, const char* s) {
    out += '"';
    for (; *s; ++s) {
        if (*s == '"' || *s == '\\') out += '\\';
        if (static_cast<unsigned char>(*s) < 0x20) { out += ' '; continue; }
        out += *s;
    }
    out += '"';
}

int linear(uint3 t) { return int(t.x + blockDim.x * (t.y + blockDim.y * t.z)); }

void yield_to_scheduler() {
    Fiber& f = fibers[current];
    start_switch(&f.fake_stack, main_stack_bottom, main_stack_size);
    context_switch(f.ctx, scheduler);
    finish_switch(f.fake_stack, nullptr, nullptr);
}

void release_barrier_if_complete() {
    if (barrier_waiting == 0 || barrier_waiting < live) return;
    for (Fiber& f : fibers)
        if (f.state == State::at_barrier) f.state = State::runnable;
    barrier_waiting = 0;
    ++epoch;
}

void on_exit() {
    Fiber& f = fibers[current];
    f.state = State::done;
    --live;
    const int me = linear(f.tid), w = me / 32, lane = me % 32;
    WarpPending& p = warps[w];
    if (p.active && (p.mask >> lane & 1u) && !(p.arrived >> lane & 1u))
        fail("shuffle_exited", p.file, p.line,
             "lane %d of warp %d returned without reaching %s at line %d, whose mask 0x%08x names it: "
             "lanes 0x%08x wait there for ever", lane, w, p.name, p.line, p.mask, p.arrived);
    release_barrier_if_complete();
}

void fiber_entry() {
    finish_switch(nullptr, &main_stack_bottom, &main_stack_size);
    body_fn(body_arg);
    on_exit();
    start_switch(nullptr, main_stack_bottom, main_stack_size);  // this fiber's frames are gone for good
    Context gone;
    context_switch(gone, scheduler);  // never resumed
}

void switch_to(int i) {
    current = i;
    threadIdx = fibers[i].tid;
    start_switch(&scheduler_fake_stack, stack_of(i), STACK);
    context_switch(scheduler, fibers[i].ctx);
    finish_switch(scheduler_fake_stack, nullptr, nullptr);
    current = -1;
}

[[noreturn]] void deadlock(int n) {
    for (int w = 0; w < int(warps.size()); ++w) {
        const WarpPending& p = warps[w];
        if (!p.active) continue;
        const unsigned missing = p.mask & ~p.arrived;
        int lane = __builtin_ctz(missing);
        const int idx = w * 32 + lane;
        const char* where = idx < n && fibers[idx].state == State::at_barrier ? "waits at __syncthreads" : "is elsewhere";
        fail("shuffle_divergence", p.file, p.line,
             "warp %d: lanes 0x%08x wait at %s (line %d) with mask 0x%08x, but lane %d %s: every lane a mask "
             "names must reach the same collective (a shuffle inside a branch that not all lanes take?)",
             w, p.arrived, p.name, p.line, p.mask, lane, where);
    }
    fail("deadlock", barrier_file, barrier_line, "the block's threads wait for each other for ever");
}

void run_block(int n) {
    for (const auto& r : shared_regions) std::memset(r.start, 0xff, r.bytes);
    ++epoch;
    updates.clear();
    std::memset(dynamic_smem.data(), 0xff, dynamic_smem.size());
    live = n;
    barrier_waiting = 0;
    for (WarpPending& p : warps) p = WarpPending{};
    for (int i = 0; i < n; ++i) {
        Fiber& f = fibers[i];
        f.state = State::runnable;
        f.tid = uint3{unsigned(i % blockDim.x), unsigned(i / blockDim.x % blockDim.y),
                      unsigned(i / (blockDim.x * blockDim.y))};
        f.fake_stack = nullptr;
#if defined(__SANITIZE_ADDRESS__)
        // An earlier fiber's frames that never returned (fiber_entry's, near the top) stay
        // poisoned; every deeper frame returned and unpoisoned itself.
        __asan_unpoison_memory_region(stack_of(i) + STACK - 16 * 1024, 16 * 1024);
#endif
        context_init(f.ctx, stack_of(i) + 4096, STACK - 4096, fiber_entry);  // the lowest page is a guard
    }
    while (live > 0) {
        bool ran = false;
        for (int k = 0; k < n; ++k) {
            const int i = reverse_order ? n - 1 - k : k;
            if (fibers[i].state != State::runnable) continue;
            switch_to(i);
            ran = true;
        }
        if (!ran && live > 0) deadlock(n);
    }
}

void ensure_stacks() {
    if (stacks) return;
    const size_t bytes = STACK * MAX_THREADS;
    void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) { std::perror("cuda_sim: mmap"); std::_Exit(4); }
    stacks = static_cast<char*>(mem);
    for (int i = 0; i < MAX_THREADS; ++i) mprotect(stack_of(i), 4096, PROT_NONE);
    fibers.resize(MAX_THREADS);
    warps.resize(MAX_THREADS / 32);
    const char* order = std::getenv("SIM_ORDER");
    reverse_order = order && std::strcmp(order, "reverse") == 0;
}

bool valid(const Config& cfg) {
    const uint64_t threads = uint64_t(cfg.block.x) * cfg.block.y * cfg.block.z;
    const uint64_t blocks = uint64_t(cfg.grid.x) * cfg.grid.y * cfg.grid.z;
    return threads >= 1 && threads <= MAX_THREADS && cfg.block.z <= 64 && blocks >= 1 && cfg.grid.x <= 2147483647u &&
           cfg.grid.y <= 65535 && cfg.grid.z <= 65535 && cfg.smem <= 227 * 1024;
}

}  // namespace

void fail(const char* kind, const char* file, int line, const char* fmt, ...) {
    char message[1024];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    std::string out = "@@SIM {\"kind\": ";
    json_string(out, kind);
    out += ", \"message\": ";
    json_string(out, message);
    out += ", \"file\": ";
    json_string(out, file ? file : "");
    out += ", \"line\": " + std::to_string(line) + ", \"kernel\": ";
    json_string(out, kernel_name);
    char where[160];
    std::snprintf(where, sizeof where, ", \"in_kernel\": %s, \"block\": [%u, %u, %u], \"thread\": [%u, %u, %u]}\n",
                  current >= 0 ? "true" : "false", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y,
                  threadIdx.z);
    out += where;
    std::fflush(stdout);
    (void)!write(2, out.data(), out.size());
    std::_Exit(3);
}

// Where the simulator is, for a sanitizer report or a time limit (called from a death
// callback or a signal handler: no allocation).
void describe_position(char* buf, size_t size) {
    std::snprintf(buf, size,
                  "@@SIM {\"kind\": \"position\", \"kernel\": \"%s\", \"in_kernel\": %s, \"block\": [%u, %u, %u], "
                  "\"thread\": [%u, %u, %u]}\n",
                  kernel_name, current >= 0 ? "true" : "false", blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
                  threadIdx.y, threadIdx.z);
}

void* dynamic_shared() { return dynamic_smem.data(); }

void shared_region(void* p, size_t bytes, const char* name) {
    for (const auto& r : shared_regions)
        if (r.start == p) return;
    shared_regions.push_back({p, bytes, name});
    std::memset(p, 0xff, bytes);
}

void note_update(const void* p, size_t bytes, const char* file, int line) {
    if (current < 0) return;
    const int me = linear(fibers[current].tid);
    Update& u = updates[p];
    if (u.epoch == epoch && u.thread != me) {
        const SharedRegion* r = nullptr;
        for (const auto& region : shared_regions)
            if (uintptr_t(p) - uintptr_t(region.start) < region.bytes) r = &region;
        fail("lost_update", file, line,
             "lost update: threads %d and %d of block %u both update shared %s[%zu] (read, change, write) with no "
             "barrier between them: on a GPU their reads and writes interleave and one update overwrites the "
             "other. Make it one atomic operation (atomicAdd), or give each thread its own slot and add the slots "
             "in a tree", u.thread, me, blockIdx.x, r ? r->name : "memory",
             r ? size_t(uintptr_t(p) - uintptr_t(r->start)) / bytes : size_t(0));
    }
    u = {epoch, me};
}

unsigned active_mask() {
    const int w = linear(threadIdx) / 32;
    unsigned mask = 0;
    const int n = int(blockDim.x * blockDim.y * blockDim.z);
    for (int lane = 0; lane < 32 && w * 32 + lane < n; ++lane)
        if (fibers[w * 32 + lane].state != State::done) mask |= 1u << lane;
    return mask;
}

void run_launch(const char* kernel, const Config& cfg, void (*body)(void*), void* arg) {
    if (current >= 0) fail("nested_launch", "", 0, "a kernel launched another kernel (not simulated)");
    if (!valid(cfg)) {  // as the GPU: the launch does not happen and cudaGetLastError says why
        last_error() = cudaErrorInvalidConfiguration;
        return;
    }
    ensure_stacks();
    kernel_name = kernel;
    body_fn = body;
    body_arg = arg;
    gridDim = cfg.grid;
    blockDim = cfg.block;
    dynamic_smem.assign(cfg.smem + 16, 0);
    const int n = int(cfg.block.x * cfg.block.y * cfg.block.z);
    std::fprintf(stdout, "{\"event\": \"launch\", \"kernel\": \"%s\", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u]}\n",
                 kernel, cfg.grid.x, cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z);
    for (unsigned z = 0; z < cfg.grid.z; ++z)
        for (unsigned y = 0; y < cfg.grid.y; ++y)
            for (unsigned x = 0; x < cfg.grid.x; ++x) {
                blockIdx = uint3{x, y, z};
                run_block(n);
            }
    threadIdx = uint3{0, 0, 0};
    blockIdx = uint3{0, 0, 0};
    kernel_name = "";
}

void syncthreads(const char* file, int line) {
    if (current < 0) fail("host_call", file, line, "__syncthreads called outside a kernel");
    if (barrier_waiting == 0) {
        barrier_file = file;
        barrier_line = line;
    } else if (line != barrier_line || std::strcmp(file, barrier_file) != 0) {
        fail("barrier_divergence", file, line,
             "thread %u waits at __syncthreads on line %d while other threads of its block wait at the one on "
             "line %d: a barrier inside a branch that not all threads take", threadIdx.x, line, barrier_line);
    }
    fibers[current].state = State::at_barrier;
    ++barrier_waiting;
    release_barrier_if_complete();
    yield_to_scheduler();
}

namespace {

uint64_t source_value(const WarpPending& p, int lane) {
    const int w = p.width, seg = lane / w * w;
    int src = lane;
    switch (p.op) {
        case Op::shfl_idx: src = seg + ((p.arg[lane] % w) + w) % w; break;
        case Op::shfl_up: src = lane - p.arg[lane] >= seg ? lane - p.arg[lane] : lane; break;
        case Op::shfl_down: src = lane + p.arg[lane] < seg + w ? lane + p.arg[lane] : lane; break;
        case Op::shfl_xor: src = (lane ^ p.arg[lane]) < seg + w ? lane ^ p.arg[lane] : lane; break;
        default: break;
    }
    if (!(p.mask >> src & 1u))
        fail("shuffle_source", p.file, p.line,
             "lane %d reads lane %d through %s, but lane %d is not in the mask 0x%08x: its value is undefined",
             lane, src, p.name, src, p.mask);
    return p.in[src];
}

void complete(WarpPending& p, int w) {
    unsigned votes = 0;
    for (int lane = 0; lane < 32; ++lane)
        if ((p.mask >> lane & 1u) && p.in[lane]) votes |= 1u << lane;
    for (int lane = 0; lane < 32; ++lane) {
        if (!(p.mask >> lane & 1u)) continue;
        Fiber& f = fibers[w * 32 + lane];
        switch (p.op) {
            case Op::ballot: f.result = votes; break;
            case Op::any: f.result = votes != 0; break;
            case Op::all: f.result = votes == p.mask; break;
            case Op::sync: f.result = 0; break;
            default: f.result = source_value(p, lane);
        }
        f.state = State::runnable;
    }
    p.active = false;
}

}  // namespace

uint64_t warp_op(Op op, const char* name, const char* file, int line, unsigned mask, uint64_t value, int arg,
                 int width) {
    if (current < 0) fail("host_call", file, line, "%s called outside a kernel", name);
    const int n = int(blockDim.x * blockDim.y * blockDim.z);
    const int me = linear(threadIdx), w = me / 32, lane = me % 32;
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail("shuffle_width", file, line, "%s width %d: it must be a power of two up to 32", name, width);
    if (!(mask >> lane & 1u))
        fail("shuffle_mask", file, line, "lane %d of warp %d calls %s with mask 0x%08x, which leaves the lane out",
             lane, w, name, mask);
    const int lanes_here = std::min(32, n - w * 32);
    const unsigned exists = lanes_here == 32 ? 0xffffffffu : (1u << lanes_here) - 1;
    if (mask & ~exists)
        fail("shuffle_mask", file, line,
             "%s with mask 0x%08x in warp %d, which has only %d threads (the block has %d): the mask names lanes "
             "that do not exist", name, mask, w, lanes_here, n);
    WarpPending& p = warps[w];
    if (!p.active) {
        p.active = true;
        p.op = op;
        p.name = name;
        p.file = file;
        p.line = line;
        p.mask = mask;
        p.arrived = 0;
        p.width = width;
    } else if (p.op != op || p.line != line || std::strcmp(p.file, file) != 0 || p.mask != mask) {
        fail("shuffle_divergence", file, line,
             "warp %d: lane %d reaches %s (line %d, mask 0x%08x) while lanes 0x%08x wait at %s (line %d, mask "
             "0x%08x): the lanes of a mask must all reach the same collective", w, lane, name, line, mask,
             p.arrived, p.name, p.line, p.mask);
    }
    p.arrived |= 1u << lane;
    p.in[lane] = value;
    p.arg[lane] = arg;
    fibers[current].state = State::at_warp;
    if (p.arrived == p.mask) complete(p, w);
    yield_to_scheduler();
    return fibers[current].result;
}

}  // namespace cuda_sim
