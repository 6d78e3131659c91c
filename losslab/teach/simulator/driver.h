// What every problem's driver shares: reading the cases run.py wrote, allocating exact-size
// buffers (so AddressSanitizer sees one element past the end), writing outputs, and
// saying where the simulator was when a sanitizer or the time limit stopped it.
//
// Protocol (run.py is the other side): argv = manifest, output folder, first case.
// The manifest's first line is the number of cases, then one line per case (fields are
// the problem driver's). stdout gets one JSON object a line ({"event": ...}), flushed, so
// the cases that finished before a fault are known.
#pragma once
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif
#include "cuda_sim.h"

namespace cuda_sim {
void describe_position(char* buf, size_t size);
}

namespace driver {

inline void report_position() {
    char buf[512];
    cuda_sim::describe_position(buf, sizeof buf);
    (void)!write(2, buf, strlen(buf));
}

inline void on_alarm(int) {
    report_position();
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_print_stack_trace();  // the running thread's stack: the line of the loop that never ends
#endif
    const char msg[] = "@@SIM {\"kind\": \"timeout\"}\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(5);
}

inline void on_abort(int) {  // UBSan with abort_on_error=1 (run.py sets it) ends here
    report_position();
    _exit(6);
}

inline void install_handlers() {
    std::signal(SIGABRT, on_abort);
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_set_death_callback(report_position);
#endif
    std::signal(SIGALRM, on_alarm);
}

// Each case gets SIM_TIME_LIMIT seconds (default 10) from its start.
inline void start_clock() {
    const char* limit = std::getenv("SIM_TIME_LIMIT");
    alarm(limit ? unsigned(std::atoi(limit)) : 10u);
}

inline void event(const std::string& json) {
    std::fputs(json.c_str(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

// A buffer of n elements of T starting `offset` elements after a 16-byte boundary: the
// allocation is offset + n elements exactly, so one element past the end is caught.
template <typename T>
T* allocate(int64_t n, int64_t offset, const char* name, int index) {
    void* base = nullptr;
    if (posix_memalign(&base, 16, size_t(offset + n) * sizeof(T) + (offset + n == 0 ? 1 : 0)) != 0) std::abort();
    T* view = static_cast<T*>(base) + offset;
    event("{\"event\": \"buffer\", \"case\": " + std::to_string(index) + ", \"name\": \"" + name +
          "\", \"start\": " + std::to_string(reinterpret_cast<uintptr_t>(view)) + ", \"end\": " +
          std::to_string(reinterpret_cast<uintptr_t>(view + n)) + "}");
    return view;
}

template <typename T>
void release(T* view, int64_t offset) { std::free(view - offset); }

template <typename T>
void read_into(FILE* f, T* dst, int64_t n) {
    if (n > 0 && std::fread(dst, sizeof(T), size_t(n), f) != size_t(n)) {
        std::fprintf(stderr, "driver: short input file\n");
        std::exit(4);
    }
}

template <typename T>
void write_output(const std::string& dir, int index, const char* name, const T* src, int64_t n) {
    const std::string path = dir + "/" + std::to_string(index) + "." + name + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) { std::perror(path.c_str()); std::exit(4); }
    if (n > 0) std::fwrite(src, sizeof(T), size_t(n), f);
    std::fclose(f);
}

template <typename T>
void fill_nan(T* p, int64_t n) {
    for (int64_t i = 0; i < n; ++i) p[i] = T(NAN);
}

}  // namespace driver
