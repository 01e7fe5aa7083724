// Names as people type them (tests/test_demangled_names.py): namespaces, a class,
// a template, overloads, a lambda, an operator. Each function prints nothing; main
// prints the counts it made, so that a probe's hits can be checked against them.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define KEEP __attribute__((noinline))

static volatile int sink;

namespace app {

KEEP int f(int x) { return x * 3 + sink; }
KEEP int f(double x) { return static_cast<int>(x * 2) + sink; }
KEEP int f(const char *s) { return static_cast<int>(std::strlen(s)) + sink; }

KEEP int parse(const char *s) { return std::atoi(s) + sink; }

struct Point {
    int x, y;
    KEEP Point operator+(const Point &o) const { return Point{x + o.x + sink, y + o.y}; }
};

class Srv {
public:
    KEEP int handle(int request) { served += request + sink; return served; }
    int served = 0;
};

template <typename T> KEEP T twice(T v) { return v + v + static_cast<T>(sink); }

KEEP int each(int n, int (*visit)(int)) {
    int total = 0;
    for (int i = 0; i < n; i++)
        total += visit(i);
    return total;
}

}  // namespace app

int main(int argc, char **argv) {
    int rounds = argc > 1 ? std::atoi(argv[1]) : 10;
    long total = 0;
    app::Srv srv;
    app::Point p{0, 0};
    for (int i = 0; i < rounds; i++) {
        total += app::f(i);                      // rounds
        total += app::f(i * 0.5);                // rounds
        total += app::f("abc");                  // rounds
        total += app::parse("12");               // rounds
        total += srv.handle(i);                  // rounds
        p = p + app::Point{1, 2};                // rounds
        total += app::twice(i);                  // rounds (int)
        total += static_cast<long>(app::twice(i * 1.5));  // rounds (double)
        // the lambda is called 3 times a round, through a function pointer
        total += app::each(3, [](int k) __attribute__((noinline)) { return k * k + sink; });
    }
    std::printf("total %ld point %d,%d served %d\n", total, p.x, p.y, srv.served);
    return 0;
}
