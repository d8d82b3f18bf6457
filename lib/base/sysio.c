/* sysio.c - see sysio.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sysio.h"

int ckpt_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO; /* the file is shorter than asked for */
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

ssize_t ckpt_preadv_all(int fd, const struct iovec *iov, int n, uint64_t off)
{
	/* done: bytes read; skip: of them, those already in iov[0] (a short
	 * read stopped inside it: the rest of it is read alone) */
	size_t done = 0, skip = 0;
	while (n > 0) {
		ssize_t k = skip ? pread(fd, (char *)iov[0].iov_base + skip, iov[0].iov_len - skip,
					 (off_t)(off + done))
				 : preadv(fd, iov, n < IOV_MAX ? n : IOV_MAX, (off_t)(off + done));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		done += (size_t)k;
		size_t got = skip + (size_t)k;
		while (n > 0 && got >= iov[0].iov_len) {
			got -= iov[0].iov_len;
			iov++;
			n--;
		}
		skip = got;
	}
	return (ssize_t)done;
}

int ckpt_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int ckpt_read_small_file(int dirfd, const char *path, size_t max, char **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	int fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return errno == ELOOP ? -EIO : -errno;
	struct stat st;
	int rc = 0;
	char *buf = NULL;
	if (fstat(fd, &st) != 0)
		rc = -errno;
	else if (!S_ISREG(st.st_mode))
		rc = -EIO;
	else if ((uint64_t)st.st_size > max)
		rc = -EFBIG;
	else if (!(buf = malloc((size_t)st.st_size + 1)))
		rc = -ENOMEM;
	else
		rc = ckpt_pread_all(fd, buf, (size_t)st.st_size, 0);
	close(fd);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[st.st_size] = 0;
	*out = buf;
	*len = (size_t)st.st_size;
	return 0;
}

int ckpt_write_file_sync_at(int dirfd, const char *path, const void *buf, size_t len)
{
	int fd = openat(dirfd, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	int rc = fd < 0 ? -errno : ckpt_pwrite_all(fd, buf, len, 0);
	if (!rc && fsync(fd))
		rc = -errno;
	if (fd >= 0 && close(fd) && !rc)
		rc = -errno;
	return rc;
}

int ckpt_write_file_sync(const char *path, const void *buf, size_t len)
{
	return ckpt_write_file_sync_at(AT_FDCWD, path, buf, len);
}

int ckpt_fsync_dir_at(int dirfd, const char *path)
{
	int fd = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = fd < 0 ? -errno : (fsync(fd) ? -errno : 0);
	if (fd >= 0)
		close(fd);
	return rc;
}

int ckpt_fsync_dir(const char *path)
{
	return ckpt_fsync_dir_at(AT_FDCWD, path);
}

static int rmtree_at(int dfd, const char *name, int depth)
{
	if (depth > 64)
		return -ELOOP;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOTDIR || errno == ELOOP)
			return unlinkat(dfd, name, 0) ? -errno : 0;
		return errno == ENOENT ? 0 : -errno;
	}
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		int r;
		if (de->d_type == DT_DIR || de->d_type == DT_UNKNOWN)
			r = rmtree_at(dirfd(d), de->d_name, depth + 1);
		else
			r = unlinkat(dirfd(d), de->d_name, 0) ? -errno : 0;
		if (r && !rc)
			rc = r;
	}
	closedir(d);
	if (unlinkat(dfd, name, AT_REMOVEDIR) && !rc && errno != ENOENT)
		rc = -errno;
	return rc;
}

int ckpt_rmtree_at(int dirfd, const char *path)
{
	return rmtree_at(dirfd, path, 0);
}

int ckpt_parse_size(const char *s, uint64_t *out)
{
	char *end;
	if (!s || !*s)
		return -EINVAL;
	errno = 0;
	unsigned long long n = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	unsigned sh = 0;
	switch (*end) {
	case 'k':
	case 'K':
		sh = 10;
		break;
	case 'm':
	case 'M':
		sh = 20;
		break;
	case 'g':
	case 'G':
		sh = 30;
		break;
	case 't':
	case 'T':
		sh = 40;
		break;
	default:
		break;
	}
	if (sh)
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || n > (UINT64_MAX >> sh))
		return -EINVAL;
	*out = (uint64_t)n << sh;
	return 0;
}

int ckpt_rmtree(const char *path)
{
	return rmtree_at(AT_FDCWD, path, 0);
}

uint64_t ckpt_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int64_t ckpt_wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
