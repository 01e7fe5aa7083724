/* Floating-point arguments and return values for probe programs (farg0..farg7,
 * fretval, (float)farg0, *(double *)p: tests/test_float_programs.py): doubles and
 * floats in registers beside integers, a float and a double in memory, the eighth
 * floating-point argument. Prints the maps the test's program should make, as
 * urewrite prints them. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#define PROBED __attribute__((noinline, noipa))  /* called as written: no clone */

struct point { long id; double weight; float ratio; };

PROBED double scale(double x, long k, double y) { return x * k + y; }
PROBED float shrink(int n, float a, float b) { return a / (n ? n : 1) - b; }
PROBED long weigh(const struct point *p) { return p->id + (long)p->weight + (p->ratio > 0.3); }
PROBED double spread(double a, double b, double c, double d, double e, double f, double g,
                     double h) { return a + b + c + d + e + f + g + h; }

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long big = 0, whole = 0, k_counts[5][2] = {{0}}, neg = 0, rmax = LONG_MIN, fsmall = 0;
    long quarter = 0, fr = 0, w = 0, ratio = 0, h_sum = 0, checksum = 0;
    double last = 0;
    for (long i = 0; i < n; i++) {
        double x = (i - n / 2) * 0.37, y = i % 3 ? 0.5 : -1e-3;
        long k = i % 5;
        double r = scale(x, k, y);
        big += x > 0.5;
        whole += x > 0.5 ? (long)x : 0;
        k_counts[k][y < 0]++;
        neg += r < 0;
        rmax = (long)r > rmax ? (long)r : rmax;

        float a = (float)x * 0.5f, b = i % 2 ? 0.25f : -1.5f;
        float s = shrink((int)(i % 4), a, b);
        fsmall += a < -0.5;
        quarter += b == 0.25f;
        fr += s >= 0.1;

        struct point p = { i, x * 2.5, (float)i / 7 };
        checksum += weigh(&p);
        w += (long)p.weight;
        ratio += p.ratio > 0.3;

        double h = i * 0.5;
        checksum += (long)spread(1, 2, 3, 4, 5, 6, 7, h);
        last = h;
        h_sum += (long)h;
    }
    printf("checksum %ld\n", checksum);
    printf("@big: %ld\n@whole: %ld\n@neg: %ld\n@rmax: %ld\n@fsmall: %ld\n@fb[0.25]: %ld\n"
           "@fb[-1.5]: %ld\n@fr: %ld\n@w: %ld\n@ratio: %ld\n@last: %.1f\n@h: %ld\n",
           big, whole, neg, rmax, fsmall, quarter, n - quarter, fr, w, ratio, last, h_sum);
    for (int k = 0; k < 5; k++)
        for (int negative = 0; negative < 2; negative++)
            if (k_counts[k][negative])
                printf("@k[%d, %d]: %ld\n", k, negative, k_counts[k][negative]);
    return 0;
}
