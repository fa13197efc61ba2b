package listen

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// watchDirs tells, through events (one pending signal at most), that
// something changed in one of dirs (inotify): the certificate poll then
// reads the files instead of checking every one of them every second.
// stop ends the watch and waits for its goroutine.
func watchDirs(dirs []string) (events <-chan struct{}, stop func(), err error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, nil, err
	}
	const mask = unix.IN_CREATE | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_MOVED_TO |
		unix.IN_MOVED_FROM | unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF
	for _, d := range dirs {
		if _, err := unix.InotifyAddWatch(fd, d, mask); err != nil {
			_ = unix.Close(fd)
			return nil, nil, err
		}
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: Close wakes the Read
	ch := make(chan struct{}, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := f.Read(buf); err != nil {
				return
			}
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	})
	return ch, func() { _ = f.Close(); wg.Wait() }, nil
}
