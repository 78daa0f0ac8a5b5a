/*
 * Control channel between the master and a worker: fixed-size messages on a
 * SOCK_SEQPACKET socketpair, with SCM_RIGHTS for handing a listening
 * socket to another worker.
 */
#include "autoconfig.h"

#include "common/channel.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

bool channel_pair(int fds[2])
{
	return socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) == 0;
}

bool channel_send(int sock, const ChannelMsg *msg, int fd)
{
	struct iovec iov = {.iov_base = (void *)msg, .iov_len = sizeof(*msg)};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.buf;
		mh.msg_controllen = sizeof(ctl.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	for (;;) {
		ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n == (ssize_t)sizeof(*msg))
			return true;
		if (n < 0 && errno == EINTR)
			continue;
		if (n >= 0)
			errno = EMSGSIZE;
		return false;
	}
}

int channel_recv(int sock, ChannelMsg *msg, int *fd)
{
	struct iovec iov = {.iov_base = msg, .iov_len = sizeof(*msg)};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct msghdr mh = {
	    .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
	*fd = -1;
	ssize_t n;
	do {
		n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	} while (n < 0 && errno == EINTR);
	if (n == 0)
		return 0;
	if (n < 0)
		return -1;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	if (n != (ssize_t)sizeof(*msg)) {
		errno = EPROTO;
		return -1;
	}
	return 1;
}
