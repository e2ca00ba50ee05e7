// Package loop runs zcnet's queues: one event loop owned by one goroutine locked to one OS
// thread (so an io_uring ring can be SINGLE_ISSUER|DEFER_TASKRUN), with
//
//   - an inbox other goroutines push work into without locks (a Treiber stack drained in FIFO
//     order per producer) and a wake-up eventfd written only when the loop sleeps; once the
//     queue stops, the inbox is sealed: Post fails with ErrClosed, never silently drops;
//   - an operation table: every asynchronous operation (an io_uring SQE, an epoll
//     registration, a shim module request) gets an id, user_data = generation<<32 | slot, with
//     a 32-bit generation per slot, so a completion that arrives after its owner went away is
//     recognised as stray (counted) and never reaches a new owner;
//   - timers (a heap, loop only);
//   - a Driver that waits for events: the io_uring driver (URing: a ring, a provided-buffer
//     ring its owner feeds with buffers, a fixed-buffer table) or the epoll driver (Epoll).
//
// Everything documented "loop only" must be called on the queue's goroutine: from an Owner's
// OnEvent, a Flusher's Flush, a timer, or a function passed to Post or Do.
//
// This package is plumbing: nothing of it appears in zc's public API.
package loop
