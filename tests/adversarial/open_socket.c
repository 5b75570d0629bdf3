/*
 * CHEAT: network access. Opens an AF_INET socket and tries to connect to a local port (a stand-in for
 * fetching precomputed answers or leaking the harness's inputs), then computes honestly.
 * WHY THE JUDGE MUST CATCH IT: no network calls; <sys/socket.h> and <netinet/in.h> are not
 * whitelisted headers and socket/connect are banned identifiers -> STATIC_CHECK.
 */
#include <math.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0) {
        struct sockaddr_in addr;
        memset(&addr, 0, sizeof addr);
        addr.sin_family = AF_INET;
        addr.sin_port = htons(4222);
        addr.sin_addr.s_addr = htonl(0x7f000001);
        connect(fd, (struct sockaddr *)&addr, sizeof addr);
        close(fd);
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) s += expf(xr[c] - m);
        const float sf = (float)s;
        for (int64_t c = 0; c < cols; c++) yr[c] = expf(xr[c] - m) / sf;
    }
}
