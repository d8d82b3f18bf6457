/*
 * zarr.h - transitional: the zarr decoder is zarr_chunk.h now (and the
 * metadata model format/zarr_meta.h).  Include zarr_chunk.h instead.
 */
#include "zarr_chunk.h"
