package loop

import (
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Epoll is the readiness driver (the plain-socket and zcshim backends): an epoll instance
// whose events carry operation ids (NewOp), so an event for a descriptor that was closed and
// reused is recognised as stray, never delivered to the new owner.
type Epoll struct {
	q      *Queue
	epfd   int
	events []unix.EpollEvent
}

// NewEpoll creates the epoll driver on the loop thread (call it from Start's init).
func NewEpoll(q *Queue) (*Epoll, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	e := &Epoll{q: q, epfd: epfd, events: make([]unix.EpollEvent, 256)}
	if err := e.Add(q.WakeFD(), unix.EPOLLIN, UDWake); err != nil {
		unix.Close(epfd)
		return nil, err
	}
	return e, nil
}

// setUD stores a 64-bit operation id in an event's data (x/sys splits it into Fd and Pad).
func setUD(ev *unix.EpollEvent, ud uint64) {
	*(*uint64)(unsafe.Pointer(&ev.Fd)) = ud
}

func getUD(ev *unix.EpollEvent) uint64 {
	return *(*uint64)(unsafe.Pointer(&ev.Fd))
}

// Add watches fd for events, reported to operation ud (loop only).
func (e *Epoll) Add(fd int, events uint32, ud uint64) error {
	ev := unix.EpollEvent{Events: events}
	setUD(&ev, ud)
	if err := unix.EpollCtl(e.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

// Mod changes what fd is watched for (loop only).
func (e *Epoll) Mod(fd int, events uint32, ud uint64) error {
	ev := unix.EpollEvent{Events: events}
	setUD(&ev, ud)
	if err := unix.EpollCtl(e.epfd, unix.EPOLL_CTL_MOD, fd, &ev); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

// Del stops watching fd (loop only). Call it before closing fd.
func (e *Epoll) Del(fd int) error {
	if err := unix.EpollCtl(e.epfd, unix.EPOLL_CTL_DEL, fd, nil); err != nil {
		return os.NewSyscallError("epoll_ctl", err)
	}
	return nil
}

// Wait implements Driver.
func (e *Epoll) Wait(timeout time.Duration) error {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	n, err := unix.EpollWait(e.epfd, e.events, ms)
	if err != nil {
		if err == unix.EINTR {
			return nil
		}
		return os.NewSyscallError("epoll_wait", err)
	}
	for i := 0; i < n; i++ {
		ev := &e.events[i]
		ud := getUD(ev)
		if ud == UDWake {
			var buf [8]byte
			unix.Read(e.q.WakeFD(), buf[:])
			continue
		}
		e.q.Dispatch(Event{UD: ud, Flags: ev.Events})
	}
	return nil
}

// Close implements Driver.
func (e *Epoll) Close() {
	if e.epfd >= 0 {
		unix.Close(e.epfd)
		e.epfd = -1
	}
}

// FD returns the epoll descriptor, for another poller to watch (a ring's POLL_ADD: the
// instance is readable while events are ready).
func (e *Epoll) FD() int { return e.epfd }
