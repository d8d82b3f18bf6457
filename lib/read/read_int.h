/*
 * read_int.h - the file map of lib/read/ (no declarations: each file's API
 * is its own header).
 *
 * Files, from the bottom up (each calls only the ones above it in this
 * list):
 *   cache.c         decoded-chunk cache: entries, LRU budget, single flight
 *   zarr_chunk.c    zarr metadata and decode units: keys, codecs, shard indexes
 *   stream.c        streaming reads of units too large to decode whole
 *   kept.c          raw unit files kept open across the reads of one epoch
 *   array.c         the read context and array handles (read, pin, prefetch)
 */
#ifndef CKPT_READ_INT_H
#define CKPT_READ_INT_H
#endif
