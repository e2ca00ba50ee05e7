// Package loop runs zcnet's queues. A Queue is one io_uring instance owned by one goroutine
// locked to one OS thread (so the ring can be SINGLE_ISSUER|DEFER_TASKRUN), with:
//
//   - a send region of mmap'd buffers registered as the ring's fixed buffers (zero-copy sends
//     name them by index),
//   - a receive region feeding a provided-buffer ring (multishot recv, bundles),
//   - an inbox other goroutines push work into without locks (a Treiber stack drained in FIFO
//     order) and a wake-up eventfd written only when the queue sleeps,
//   - completion dispatch by user_data: the high 32 bits name an Owner registered with the
//     queue, the low 32 bits are the owner's tag.
//
// Everything named "loop only" must be called on the queue's goroutine: from an Owner's
// OnCQE, from a Flusher's Flush, or from a function passed to Post or Do.
//
// Queue.Close stops the loop: it waits (bounded) for zero-copy notifications still
// outstanding, then closes the ring and unmaps the regions.
package loop
