// Return probes and C++ exceptions: frames an exception passes through report no
// return, and the program behaves exactly as the original.
#include <cstdio>
#include <stdexcept>
#include <string>

static volatile int sink;

__attribute__((noinline)) int thrower(int i) {
    if (i % 5 == 0)
        throw std::runtime_error("bad " + std::to_string(i));
    return i + sink;
}

__attribute__((noinline)) int middle(int i) { return thrower(i) * 2 + sink; }

int main() {
    int caught = 0, returned = 0;
    long sum = 0;
    for (int i = 0; i < 100; i++) {
        try {
            sum += middle(i);
            returned++;
        } catch (const std::exception &e) {
            caught++;
        }
    }
    std::printf("sum %ld caught %d\nreturns middle %d\nreturns thrower %d\n", sum, caught,
                returned, returned);
    return 0;
}
