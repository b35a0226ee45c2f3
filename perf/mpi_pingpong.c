/*
 * The Open MPI peer for compare.sh, measured exactly as tern-perf measures:
 *   mpi-pingpong lat SIZE ITERS          one-way latency (RTT/2): avg and p50 in us
 *   mpi-pingpong bw SIZE ITERS WINDOW    unidirectional bandwidth in GB/s
 * Run with mpirun -np 2. Rank 0 prints.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (argc < 4) {
        if (rank == 0)
            fprintf(stderr, "usage: %s lat SIZE ITERS | bw SIZE ITERS WINDOW\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    int lat = strcmp(argv[1], "lat") == 0;
    size_t size = strtoull(argv[2], NULL, 10);
    int iters = atoi(argv[3]), window = argc > 4 ? atoi(argv[4]) : 64, warm = iters / 10 + 1;
    int peer = rank ^ 1;
    char *buf = malloc(size + 1), ack = 0; /* one buffer for a window, as osu_bw */
    double *s = calloc((size_t)iters, sizeof(double)), t0 = 0;
    MPI_Request *reqs = calloc((size_t)window, sizeof(*reqs));
    memset(buf, 1, size + 1);
    MPI_Barrier(MPI_COMM_WORLD);
    /* One clock read per iteration, where tern-perf takes it: a ping-pong's
     * right after rank 0's send, so it overlaps the reply's flight (a sample
     * runs from one send to the next); a window's after the ack. */
    double t = MPI_Wtime();
    for (int i = 0; i < warm + iters; i++) {
        if (i == warm)
            t0 = t;
        if (lat) {
            if (rank == 0) {
                MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            } else {
                MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            }
        } else {
            for (int w = 0; w < window; w++) {
                if (rank == 0)
                    MPI_Isend(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[w]);
                else
                    MPI_Irecv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[w]);
            }
            MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
            if (rank == 0)
                MPI_Recv(&ack, 1, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else
                MPI_Send(&ack, 1, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
        }
        double t1 = MPI_Wtime();
        if (i >= warm)
            s[i - warm] = t1 - t;
        t = t1;
        if (lat && rank == 0)
            MPI_Recv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    double secs = MPI_Wtime() - t0;
    if (rank == 0) {
        if (lat) {
            double sum = 0;
            for (int i = 0; i < iters; i++)
                sum += s[i];
            qsort(s, (size_t)iters, sizeof(double), cmp);
            printf("lat,%zu,%.3f,%.3f\n", size, sum / iters / 2 * 1e6, s[iters / 2] / 2 * 1e6);
        } else {
            printf("bw,%zu,%.3f\n", size, (double)size * window * iters / secs / 1e9);
        }
    }
    free(reqs);
    free(s);
    free(buf);
    MPI_Finalize();
    return 0;
}
