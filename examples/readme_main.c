/*
 * The README's usage example, built and run as a test so that it cannot
 * drift from the library: CMake copies the first C block of README.md into
 * readme_snippet.inc (examples/CMakeLists.txt). The block leaves st, rank and
 * grad behind, and what it computes is checked here: rank 1 received rank
 * 0's gradient, so the average of the last element is (2 + ... + n-1) / n.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <tern/tern.h>

int main(int argc, char **argv)
{
    const int n = argc > 1 ? atoi(argv[1]) : 0; /* the world size, as the test launches it */
#include "readme_snippet.inc"
    if (st != TERN_OK)
        return 1;
    float want = 0;
    for (int r = 2; r < n; r++)
        want += (float)r;
    want /= (float)n;
    if (n < 2 || grad[0] != 1 || grad[1] != 2 || grad[2] != 3 || fabsf(grad[3] - want) > 1e-6f) {
        fprintf(stderr, "rank %d: got %g %g %g %g, want 1 2 3 %g (world %d)\n", rank, grad[0],
                grad[1], grad[2], grad[3], want, n);
        return 1;
    }
    return 0;
}
