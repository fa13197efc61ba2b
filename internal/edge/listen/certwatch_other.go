//go:build !linux

package listen

import "errors"

// watchDirs is Linux-only (inotify); elsewhere the files are polled.
func watchDirs([]string) (<-chan struct{}, func(), error) {
	return nil, nil, errors.New("no directory notifications on this system")
}
