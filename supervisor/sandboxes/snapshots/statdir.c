/* One folder's entries, each with its lstat, for a capture's walk (statdir.py).
 *
 * stockade_statdir(fd, depth, out, cap) lists the open folder `fd` (through a duplicate of
 * it, so the caller's descriptor and offset are left alone), takes an lstat of each entry
 * relative to `fd` (statx, or fstatat, with AT_SYMLINK_NOFOLLOW: nothing is followed), and
 * writes one
 * record per entry, sorted by the name's bytes, each ended by a NUL:
 *
 *     DEPTH MODE DEV INO CTIME_NS SIZE MTIME_NS/NAME\0
 *
 * the numbers in decimal (MODE the whole st_mode), NAME the entry's bytes as they are (a name
 * holds neither NUL nor '/', so the first '/' ends the numbers and the NUL ends the record).
 * An entry gone between the listing and its lstat is left out. It returns the bytes written;
 * -ERANGE when `cap` is too small (the caller tries again with more); -errno on any other
 * failure (the caller then reads the folder its own way). It holds no lock of the caller's:
 * called through ctypes, it runs without the interpreter's lock.
 *
 * Built by scripts/setup.sh (`make statdir`):
 *     cc -O2 -shared -fPIC -o _statdir.so statdir.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* What a record holds. statx asks for only these (~15% quicker here than fstatat, which
 * fills every field); an entry whose file system does not give them all is asked again by
 * fstatat. */
#define WANTED (STATX_TYPE | STATX_MODE | STATX_INO | STATX_SIZE | STATX_MTIME | STATX_CTIME)

struct entry_stat {
    uint64_t mode, dev, ino;
    int64_t ctime_ns, size, mtime_ns;
};

/* The lstat of `name` in `fd`; 0, or -1 with errno set. */
static int lstat_at(int fd, const char *name, struct entry_stat *out) {
    struct statx sx;
    if (statx(fd, name, AT_SYMLINK_NOFOLLOW | AT_STATX_SYNC_AS_STAT, WANTED, &sx) == 0
        && (sx.stx_mask & WANTED) == WANTED) {
        out->mode = sx.stx_mode;
        out->dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
        out->ino = sx.stx_ino;
        out->ctime_ns = (int64_t)sx.stx_ctime.tv_sec * 1000000000 + sx.stx_ctime.tv_nsec;
        out->size = (int64_t)sx.stx_size;
        out->mtime_ns = (int64_t)sx.stx_mtime.tv_sec * 1000000000 + sx.stx_mtime.tv_nsec;
        return 0;
    }
    if (errno == ENOENT) return -1;
    struct stat st;
    if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return -1;
    out->mode = st.st_mode;
    out->dev = st.st_dev;
    out->ino = st.st_ino;
    out->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    out->size = (int64_t)st.st_size;
    out->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    return 0;
}

struct name {
    char *text;
    size_t len;
};

static int by_bytes(const void *a, const void *b) {
    const struct name *x = a, *y = b;
    return strcmp(x->text, y->text); /* strcmp compares as unsigned char: the bytes' order */
}

/* Writes v in decimal at p (at most 20 digits and a sign), returns the end. */
static char *decimal(char *p, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) *p++ = '-';
    while (n) *p++ = tmp[--n];
    return p;
}

static char *udecimal(char *p, uint64_t u) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n) *p++ = tmp[--n];
    return p;
}

static void free_names(struct name *names, size_t count) {
    for (size_t i = 0; i < count; i++) free(names[i].text);
    free(names);
}

long stockade_statdir(int fd, int depth, char *out, size_t cap) {
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) return -errno;
    DIR *dir = fdopendir(copy);
    if (!dir) {
        int err = errno;
        close(copy);
        return -err;
    }
    rewinddir(dir); /* the duplicate shares the caller's offset */
    struct name *names = NULL;
    size_t count = 0, room = 0;
    long result = 0;
    for (;;) {
        errno = 0;
        struct dirent *ent = readdir(dir);
        if (!ent) {
            if (errno) result = -errno;
            break;
        }
        const char *n = ent->d_name;
        if (n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0))) continue;
        if (count == room) {
            room = room ? room * 2 : 64;
            struct name *more = realloc(names, room * sizeof *names);
            if (!more) {
                result = -ENOMEM;
                break;
            }
            names = more;
        }
        size_t len = strlen(n);
        char *text = malloc(len + 1);
        if (!text) {
            result = -ENOMEM;
            break;
        }
        memcpy(text, n, len + 1);
        names[count].text = text;
        names[count].len = len;
        count++;
    }
    rewinddir(dir);
    closedir(dir); /* closes `copy` */
    if (result < 0) {
        free_names(names, count);
        return result;
    }
    if (count) qsort(names, count, sizeof *names, by_bytes);
    char *p = out, *end = out + cap;
    for (size_t i = 0; i < count; i++) {
        struct entry_stat st;
        if (lstat_at(fd, names[i].text, &st) != 0) {
            if (errno == ENOENT) continue;
            result = -errno;
            break;
        }
        /* 7 numbers of at most 21 characters, 7 separators, the name, its NUL */
        if ((size_t)(end - p) < 7 * 22 + names[i].len + 1) {
            result = -ERANGE;
            break;
        }
        p = decimal(p, depth);
        *p++ = ' ';
        p = udecimal(p, st.mode);
        *p++ = ' ';
        p = udecimal(p, st.dev);
        *p++ = ' ';
        p = udecimal(p, st.ino);
        *p++ = ' ';
        p = decimal(p, st.ctime_ns);
        *p++ = ' ';
        p = decimal(p, st.size);
        *p++ = ' ';
        p = decimal(p, st.mtime_ns);
        *p++ = '/';
        memcpy(p, names[i].text, names[i].len);
        p += names[i].len;
        *p++ = 0;
    }
    free_names(names, count);
    return result < 0 ? result : (long)(p - out);
}
