/* A workout for the C and C++ libraries (tests/test_aarch64_libraries.py): strings,
 * containers, streams, threads, an exception, malloc and libm; prints what it made. */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <map>
#include <algorithm>
#include <thread>
#include <sstream>
#include <stdexcept>
int main(int argc, char **argv) {
    std::vector<std::string> v;
    for (int i = 0; i < 2000; i++) { char b[32]; snprintf(b, sizeof b, "k%05d", (i * 7919) % 2000); v.push_back(b); }
    std::sort(v.begin(), v.end());
    std::map<std::string, int> m;
    for (auto &s : v) m[s.substr(0, 3)]++;
    std::ostringstream os;
    for (auto &kv : m) os << kv.first << "=" << kv.second << ";";
    long total = 0;
    std::vector<std::thread> ts;
    std::vector<long> part(4);
    for (int t = 0; t < 4; t++) ts.emplace_back([&, t] { for (int i = 0; i < 100000; i++) part[t] += i % (t + 3); });
    for (auto &t : ts) t.join();
    for (long p : part) total += p;
    try { throw std::runtime_error("boom"); } catch (const std::exception &e) { os << e.what(); }
    char *p = (char *)malloc(1000); memset(p, 'x', 999); p[999] = 0;
    printf("%s %ld %zu %.3f\n", os.str().c_str(), total, strlen(p), atof("3.14159"));
    free(p);
    return 0;
}
