/*
 * stockade-drop: run a program as the sandbox user.
 *
 *   stockade-drop UID GID DIR SIGNALS PROGRAM [ARG...]
 *
 * Sets all three group ids to GID and all three user ids to UID, changes to DIR unless it
 * is "-", leaves SIGXFSZ ignored when SIGNALS is "x" ("-": as inherited), then executes
 * PROGRAM (a path, not looked up) with ARG... and the environment it was given.
 *
 * The agent runs with real and saved uid of its own and the sandbox user as effective uid,
 * so sandbox code (which has the sandbox user as real uid) can neither signal nor trace it.
 * A command it starts must have the sandbox user in all three ids, which an exec alone
 * cannot do (execve copies the effective uid to the saved one, never to the real one), and
 * the agent cannot fork cheaply (a Python process of tens of MiB). So it posix_spawns this
 * program in front of each command: setresuid needs no privilege when every id it sets is
 * the effective one. No C library: the whole program is six system calls, and an exec of it
 * costs ~40 us where a static glibc binary costs ~300 us (its start-up) and setpriv ~800 us.
 *
 * Exit status 126: an id or the folder could not be set; 127: PROGRAM could not be executed.
 * A message naming the failed step goes to standard error.
 */

typedef unsigned long word;

#if defined(__x86_64__)
enum { SYS_write = 1, SYS_rt_sigaction = 13, SYS_execve = 59, SYS_exit = 60, SYS_chdir = 80,
       SYS_setresuid = 117, SYS_setresgid = 119 };
static long sys3(long n, long a, long b, long c) {
    long r;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return r;
}
static long sys4(long n, long a, long b, long c, long d) {
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return r;
}
__asm__(".globl _start\n_start:\n xor %rbp, %rbp\n mov %rsp, %rdi\n and $-16, %rsp\n"
        " call start\n hlt\n");
#elif defined(__aarch64__)
enum { SYS_write = 64, SYS_rt_sigaction = 134, SYS_execve = 221, SYS_exit = 93, SYS_chdir = 49,
       SYS_setresuid = 147, SYS_setresgid = 149 };
static long sys4(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
}
static long sys3(long n, long a, long b, long c) { return sys4(n, a, b, c, 0); }
__asm__(".globl _start\n_start:\n mov x0, sp\n bl start\n");
#else
#error "stockade-drop: only x86_64 and aarch64"
#endif

enum { SIGXFSZ = 25 };

struct kernel_sigaction {
    word handler, flags, restorer, mask;
};

static word length(const char *s) {
    word n = 0;
    while (s[n]) n++;
    return n;
}

__attribute__((noreturn)) static void fail(int status, const char *what, const char *arg) {
    sys3(SYS_write, 2, (long)"stockade-drop: ", 15);
    sys3(SYS_write, 2, (long)what, (long)length(what));
    sys3(SYS_write, 2, (long)arg, (long)length(arg));
    sys3(SYS_write, 2, (long)"\n", 1);
    for (;;) sys3(SYS_exit, status, 0, 0);
}

/* A decimal id below 2^32 - 1 ((uid_t)-1 means "unchanged" to setresuid), or fail. */
static long id(const char *s) {
    word value = 0;
    if (!*s) fail(126, "empty id", "");
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || value > 0xFFFFFFFEul / 10) fail(126, "bad id: ", s);
        value = value * 10 + (word)(*p - '0');
    }
    if (value > 0xFFFFFFFEul) fail(126, "bad id: ", s);
    return (long)value;
}

__attribute__((noreturn, used)) void start(long *stack) {
    long argc = stack[0];
    char **argv = (char **)(stack + 1);
    char **envp = argv + argc + 1;
    if (argc < 6) fail(126, "usage: stockade-drop UID GID DIR|- x|- PROGRAM [ARG...]", "");
    long uid = id(argv[1]), gid = id(argv[2]);
    if (sys3(SYS_setresgid, gid, gid, gid) != 0) fail(126, "setresgid failed for ", argv[2]);
    if (sys3(SYS_setresuid, uid, uid, uid) != 0) fail(126, "setresuid failed for ", argv[1]);
    if (!(argv[3][0] == '-' && !argv[3][1]) && sys3(SYS_chdir, (long)argv[3], 0, 0) != 0)
        fail(126, "cannot change to folder ", argv[3]);
    if (argv[4][0] == 'x') {
        struct kernel_sigaction ignore = {1 /* SIG_IGN */, 0, 0, 0};
        sys4(SYS_rt_sigaction, SIGXFSZ, (long)&ignore, 0, sizeof(word));
    }
    sys3(SYS_execve, (long)argv[5], (long)(argv + 5), (long)envp);
    fail(127, "cannot execute ", argv[5]);
}
