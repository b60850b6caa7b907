/* What one wake-up costs this machine's kernel with no work of its own: a
 * thread sleeps a tick, then does what the router's thread does on waking
 * at a low rate (one epoll_wait, a read of each of two loopback TCP
 * sockets, a write to each), while a second thread plays the broker (writes
 * a delivery and a confirm every 10 ms, drains what it is sent). Prints the
 * sleeping thread's CPU a wake-up (CLOCK_THREAD_CPUTIME_ID).
 *
 *   gcc -O2 -pthread benches/wakeup/floor.c -o /tmp/wakeup-floor
 *   /tmp/wakeup-floor 20000    # the tick in microseconds; 500 wake-ups
 *
 * README, Performance: "What a wake-up costs". Not built by cargo. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int pair(int *server) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000001);
    socklen_t l = sizeof a;
    if (bind(ls, (void *)&a, sizeof a) || listen(ls, 1) || getsockname(ls, (void *)&a, &l)) {
        perror("listen");
        exit(1);
    }
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (void *)&a, sizeof a)) {
        perror("connect");
        exit(1);
    }
    *server = accept(ls, 0, 0);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(*server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    close(ls);
    return c;
}

static int peer[2], mine[2];

static void *broker(void *unused) {
    (void)unused;
    char out[600], in[65536];
    memset(out, 2, sizeof out);
    int ep = epoll_create1(0);
    for (int i = 0; i < 2; i++) {
        struct epoll_event e = {.events = EPOLLIN, .data.fd = peer[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, peer[i], &e);
    }
    for (;;) {
        struct epoll_event got[2];
        int n = epoll_wait(ep, got, 2, 10);
        for (int i = 0; i < n; i++)
            while (recv(got[i].data.fd, in, sizeof in, MSG_DONTWAIT) > 0) {
            }
        if (n == 0) {
            send(peer[0], out, 600, 0); /* a delivery */
            send(peer[1], out, 40, 0);  /* confirms */
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    long tick_us = argc > 1 ? atol(argv[1]) : 20000;
    for (int i = 0; i < 2; i++) mine[i] = pair(&peer[i]);
    pthread_t t;
    pthread_create(&t, 0, broker, 0);
    int ep = epoll_create1(0);
    for (int i = 0; i < 2; i++) {
        struct epoll_event e = {.events = EPOLLIN, .data.fd = mine[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, mine[i], &e);
    }
    char out[600], in[65536];
    memset(out, 1, sizeof out);
    struct timespec tick = {tick_us / 1000000, (tick_us % 1000000) * 1000}, t0, t1;
    sleep(1);
    const int n = 500;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (int i = 0; i < n; i++) {
        nanosleep(&tick, 0);
        struct epoll_event got[2];
        int k = epoll_wait(ep, got, 2, 0);
        for (int j = 0; j < k; j++)
            while (recv(got[j].data.fd, in, sizeof in, MSG_DONTWAIT) > 0) {
            }
        send(mine[0], out, 600, 0); /* publishes */
        send(mine[1], out, 30, 0);  /* acks */
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    double us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / n;
    printf("tick %ld us: %.1f us of CPU a wake-up (sleep, epoll_wait, 2 reads, 2 writes)\n", tick_us, us);
    return 0;
}
