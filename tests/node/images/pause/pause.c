/* The pod sandbox's one process: it holds the pod's namespaces open and does nothing else.
 * It exits on SIGINT or SIGTERM and reaps any child it inherits (as PID 1 of a shared PID
 * namespace). Written here because no registry is reachable to pull registry.k8s.io/pause. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {}
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop}, on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &on_stop, NULL) < 0 || sigaction(SIGTERM, &on_stop, NULL) < 0 ||
        sigaction(SIGCHLD, &on_child, NULL) < 0)
        return 1;
    for (;;) pause();
}
