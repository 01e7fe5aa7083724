// C++ landing pads as branch targets: the unwinder, not a branch, enters them.
// A catch block and a cleanup (a destructor run while an exception passes)
// each start right after a call or a short jump, so a patch window around the
// instruction before one would cover it. Output: what the program counted.
#include <cstdio>
#include <stdexcept>

static volatile int sink;
static int destroyed, caught_small, caught_big, returned;

struct Guard {  // its destructor is a cleanup landing pad in every frame that holds one
    int id;
    explicit Guard(int i) : id(i) {}
    ~Guard() { destroyed++; sink = id; }
};

__attribute__((noinline)) int check(int i) {
    if (i % 7 == 3)
        throw std::out_of_range("small");
    if (i % 11 == 5)
        throw std::runtime_error("big");
    return i + sink;
}

__attribute__((noinline)) int guarded(int i) {
    Guard g(i);
    int r = check(i);  // a throw here runs ~Guard in a cleanup pad, then resumes unwinding
    return r * 2 + sink;
}

__attribute__((noinline)) long catcher(int i) {
    long r = 0;
    try {
        r = guarded(i);
        returned++;
    } catch (const std::out_of_range &) {
        caught_small++;
        r = -1;
    } catch (const std::exception &) {
        caught_big++;
        r = -2;
    }
    return r;
}

int main() {
    long sum = 0;
    for (int i = 0; i < 200; i++)
        sum += catcher(i);
    std::printf("sum %ld\nreturned %d\ncaught small %d\ncaught big %d\ndestroyed %d\n", sum,
                returned, caught_small, caught_big, destroyed);
    return 0;
}
