/*
 * zipimage.c - the file image of a torch.save zip archive, filled window
 * by window without Python work per record.
 *
 * ZipImage(items, size, nparts, zip64_limit, checksum=True) takes a file
 * of laid-out archives (nvio._base.torchzip: Record objects in file
 * order, each with its local header bytes; the small records' bytes by
 * name; every other record's data at an address of host memory), one for
 * nvio.save, one per item for a DCP rank file with raw byte items
 * between them, and turns it once into a table of pieces: local header,
 * small record's bytes, tensor bytes, descriptor, each archive's central
 * directory at its end, zeros in the gaps (alignment between archives).
 * Items: (base, records, meta, sources, dir_offset, size) for an archive
 * at file offset base (sources: each tensor record's address in file
 * order, or one address A with each record's bytes at A + its data
 * offset: an image in memory), (base, bytes) for raw bytes.
 * Then, for each window [w0, w1) of the file, in order:
 *
 *   copy(base, w0, w1, part)   part `part` of nparts equal byte ranges of
 *                              the window: its tensor bytes copied to
 *                              base + (offset - w0) and checksummed in
 *                              the same pass, the GIL released (the
 *                              parts of a window run on as many threads);
 *                              a source that already is its destination
 *                              (an image in memory) is only checksummed
 *   fill(base, w0, w1)         with every part copied: the window's CRCs
 *                              joined into the records' (crc32_combine),
 *                              then its headers, small records,
 *                              descriptors and directory written
 *
 * An archive's directory is made when the window holding it is filled
 * (every CRC is known by then), and its tensor records' `crc` attributes
 * are set at that moment. checksum=False computes no CRC: the records'
 * crc as given (DCP's crc32=False). zip_directory(records, cursor, zip64_limit) makes the same
 * bytes from records whose CRCs are set: torchzip.Layout.directory() is
 * that call, and zip_local_header() makes Layout.add()'s local headers:
 * the format's headers are written in this one place (the 16- or 24-byte
 * descriptor also by Record.descriptor(), for the direct writers).
 *
 * A state of 50,000 tiny tensors spent 0.37 s of its 1.0 s save walking
 * these pieces in Python; the caller vouches for the addresses as for
 * copy_many (storages it holds, a buffer it owns).
 */
#include "ext.h"

#include <stdlib.h>
#include <string.h>

enum { PIECE_BYTES, PIECE_DATA, PIECE_DESC, PIECE_DIR, PIECE_ZERO };

struct piece {
	uint64_t off, end;
	const unsigned char *p;		/* BYTES: its bytes; DATA: the source */
	uint32_t rec;			/* DATA, DESC: the record; DIR: the image */
	uint8_t kind;
};

struct zrec {
	PyObject *obj;			/* the Record (a reference) */
	PyObject *name;			/* its name (a reference) */
	uint64_t size, header_offset;
	uint64_t done;			/* data bytes checksummed so far */
	uint32_t crc;
	uint8_t zip64, is_data;
};

struct frag {
	uint64_t off, len;
	uint32_t piece, crc;
};

struct part {
	struct frag *v;
	size_t n, cap;
	int failed;			/* out of memory while recording */
};

/* One torch.save archive of the file (a DCP rank file holds many). */
struct zimg {
	uint32_t r0, n;			/* its records: recs[r0, r0 + n) */
	uint64_t dir_offset;		/* where its directory starts, in the archive */
	unsigned char *dir;		/* the directory, once made */
	uint64_t base;			/* where the archive starts in the file */
	int open;			/* extend() may still add records */
};

typedef struct {
	PyObject_HEAD
	struct zrec *recs;
	uint32_t nrecs, recs_cap;
	struct zimg *imgs;
	uint32_t nimgs, imgs_cap;
	struct piece *pieces;
	uint32_t npieces, cap;
	PyObject *keep;			/* list: the bytes objects pieces point into */
	struct part *parts;
	unsigned nparts;
	int checksum;			/* 0: the records' crc as given, none computed */
	uint64_t size, limit;
	uint64_t filled;		/* the file's bytes filled so far */
	int copying;			/* copy() calls running (GIL released) */
	int broken;			/* an extend() failed half way */
} ZipImageObject;

static void le16(unsigned char *p, unsigned v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static void le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static void le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* An attribute of o as an unsigned 64-bit int; -1 with an exception set. */
static int attr_u64(PyObject *o, const char *name, uint64_t *out)
{
	PyObject *v = PyObject_GetAttrString(o, name);
	if (!v)
		return -1;
	unsigned long long x = PyLong_AsUnsignedLongLong(v);
	Py_DECREF(v);
	if (x == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	*out = x;
	return 0;
}

/*
 * Reads one Record into r (the references taken): its name, size, offsets,
 * zip64 flag and, with want_crc, its crc. 0, or -1 with an exception set.
 */
static int rec_read(PyObject *o, struct zrec *r, int want_crc)
{
	uint64_t crc = 0, z = 0;
	memset(r, 0, sizeof(*r));
	r->name = PyObject_GetAttrString(o, "name");
	if (!r->name)
		return -1;
	if (!PyUnicode_Check(r->name)) {
		PyErr_Format(PyExc_TypeError, "nvio: a zip record's name is not a str");
		Py_CLEAR(r->name);
		return -1;
	}
	if (attr_u64(o, "size", &r->size) < 0 ||
	    attr_u64(o, "header_offset", &r->header_offset) < 0 ||
	    attr_u64(o, "zip64", &z) < 0 || (want_crc && attr_u64(o, "crc", &crc) < 0)) {
		Py_CLEAR(r->name);
		return -1;
	}
	if (crc > 0xFFFFFFFFu) {
		PyErr_Format(PyExc_ValueError, "nvio: zip record %R: crc %llu is not 32 bits",
			     r->name, (unsigned long long)crc);
		Py_CLEAR(r->name);
		return -1;
	}
	r->crc = (uint32_t)crc;
	r->zip64 = z != 0;
	r->obj = Py_NewRef(o);
	return 0;
}

static void recs_free(struct zrec *recs, uint32_t n)
{
	for (uint32_t i = 0; recs && i < n; i++) {
		Py_XDECREF(recs[i].obj);
		Py_XDECREF(recs[i].name);
	}
	PyMem_Free(recs);
}

/*
 * The central directory and end records of n records (crc set) whose
 * directory starts at cursor: torch's and APPNOTE's layout, zip64 fields
 * for sizes and offsets from limit on. A bytes object, or NULL.
 */
static PyObject *directory_bytes(const struct zrec *recs, uint32_t n, uint64_t cursor,
				 uint64_t limit)
{
	uint64_t len = 56 + 20 + 22;
	for (uint32_t i = 0; i < n; i++) {
		Py_ssize_t nl;
		if (!PyUnicode_AsUTF8AndSize(recs[i].name, &nl))
			return NULL;
		unsigned k = 2 * (recs[i].size >= limit) + (recs[i].header_offset >= limit);
		len += 46 + (uint64_t)nl + (k ? 4 + 8 * k : 0);
	}
	PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
	if (!out)
		return NULL;
	unsigned char *p = (unsigned char *)PyBytes_AsString(out);
	unsigned char *start = p;
	for (uint32_t i = 0; i < n; i++) {
		const struct zrec *r = &recs[i];
		Py_ssize_t nl;
		const char *name = PyUnicode_AsUTF8AndSize(r->name, &nl);
		uint64_t z[3];
		unsigned k = 0;
		uint32_t size32 = (uint32_t)r->size, off32 = (uint32_t)r->header_offset;
		if (r->size >= limit) {
			z[k++] = r->size;
			z[k++] = r->size;
			size32 = 0xFFFFFFFFu;
		}
		if (r->header_offset >= limit) {
			z[k++] = r->header_offset;
			off32 = 0xFFFFFFFFu;
		}
		unsigned ver = k ? 45 : 20;
		le32(p, 0x02014B50u);
		le16(p + 4, ver);
		le16(p + 6, ver);
		le16(p + 8, (1u << 3) | (1u << 11));	/* descriptor, UTF-8 */
		le16(p + 10, 0);			/* stored */
		le16(p + 12, 0);
		le16(p + 14, 0);
		le32(p + 16, r->crc);
		le32(p + 20, size32);
		le32(p + 24, size32);
		le16(p + 28, (unsigned)nl);
		le16(p + 30, k ? 4 + 8 * k : 0);
		le16(p + 32, 0);
		le16(p + 34, 0);
		le16(p + 36, 0);
		le32(p + 38, 0);
		le32(p + 42, off32);
		memcpy(p + 46, name, (size_t)nl);
		p += 46 + nl;
		if (k) {
			le16(p, 0x0001);
			le16(p + 2, 8 * k);
			for (unsigned j = 0; j < k; j++)
				le64(p + 4 + 8 * j, z[j]);
			p += 4 + 8 * k;
		}
	}
	uint64_t cd_len = (uint64_t)(p - start);
	uint64_t z64_off = cursor + cd_len;
	le32(p, 0x06064B50u);			/* zip64 end of central directory */
	le64(p + 4, 56 - 12);
	le16(p + 12, 45);
	le16(p + 14, 45);
	le32(p + 16, 0);
	le32(p + 20, 0);
	le64(p + 24, n);
	le64(p + 32, n);
	le64(p + 40, cd_len);
	le64(p + 48, cursor);
	p += 56;
	le32(p, 0x07064B50u);			/* its locator */
	le32(p + 4, 0);
	le64(p + 8, z64_off);
	le32(p + 16, 1);
	p += 20;
	le32(p, 0x06054B50u);			/* end of central directory */
	le16(p + 4, 0);
	le16(p + 6, 0);
	le16(p + 8, n < 0xFFFF ? n : 0xFFFF);
	le16(p + 10, n < 0xFFFF ? n : 0xFFFF);
	le32(p + 12, cd_len < 0xFFFFFFFFu ? (uint32_t)cd_len : 0xFFFFFFFFu);
	le32(p + 16, cursor < 0xFFFFFFFFu ? (uint32_t)cursor : 0xFFFFFFFFu);
	le16(p + 20, 0);
	return out;
}

/*
 * Room for `need` elements of `size` bytes in the array *v of capacity
 * *cap (at least doubled). 0, or -1 with MemoryError set.
 */
static int reserve(void **v, uint32_t *cap, uint64_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	uint64_t c = *cap ? 2 * (uint64_t)*cap : 16;
	if (c < need)
		c = need;
	void *p = c <= UINT32_MAX ? PyMem_Realloc(*v, (size_t)c * size) : NULL;
	if (!p) {
		PyErr_NoMemory();
		return -1;
	}
	*v = p;
	*cap = (uint32_t)c;
	return 0;
}

static int add_piece(ZipImageObject *z, uint64_t off, uint64_t len, int kind,
		     const unsigned char *p, uint32_t rec)
{
	uint64_t end = z->npieces ? z->pieces[z->npieces - 1].end : 0;
	if (off < end) {
		PyErr_Format(PyExc_ValueError, "nvio: zip image: a piece at offset %llu "
			     "overlaps one that ends at %llu (a layout that is not in file "
			     "order)", (unsigned long long)off, (unsigned long long)end);
		return -1;
	}
	if (off > end && add_piece(z, end, off - end, PIECE_ZERO, NULL, 0) < 0)
		return -1;	/* a gap between archives (alignment): zeros */
	if (!len)
		return 0;
	void *v = z->pieces;
	int rc = reserve(&v, &z->cap, (uint64_t)z->npieces + 1, sizeof(*z->pieces));
	z->pieces = v;
	if (rc < 0)
		return -1;
	struct piece *pc = &z->pieces[z->npieces++];
	pc->off = off;
	pc->end = off + len;
	pc->kind = (uint8_t)kind;
	pc->p = p;
	pc->rec = rec;
	return 0;
}

/* A bytes object's bytes, kept alive by z->keep; NULL with an error. */
static const unsigned char *kept_bytes(ZipImageObject *z, PyObject *b, Py_ssize_t *len,
				       PyObject *name, const char *what)
{
	if (!PyBytes_Check(b)) {
		PyErr_Format(PyExc_TypeError, "nvio: zip record %R: its %s is not bytes",
			     name, what);
		return NULL;
	}
	if (PyList_Append(z->keep, b) < 0)
		return NULL;
	*len = PyBytes_Size(b);
	return (const unsigned char *)PyBytes_AsString(b);
}

/* A new archive at file offset base, open for records; its index or -1. */
static int64_t image_open(ZipImageObject *z, uint64_t base)
{
	void *arr = z->imgs;
	int rc = reserve(&arr, &z->imgs_cap, (uint64_t)z->nimgs + 1, sizeof(*z->imgs));
	z->imgs = arr;
	if (rc < 0)
		return -1;
	z->imgs[z->nimgs] = (struct zimg){ z->nrecs, 0, 0, NULL, base, 1 };
	return z->nimgs++;
}

/*
 * Appends records to open archive img: records (Record objects in file
 * order), meta (the small records' bytes by name), sources (a list: the
 * address of each tensor record's bytes; an int A: each at A + its data
 * offset). 0, or -1 with an exception set.
 */
static int image_records(ZipImageObject *z, uint32_t img, PyObject *records, PyObject *meta,
			 PyObject *sources)
{
	int by_offset = PyLong_Check(sources);
	uint64_t src_base = 0, base = z->imgs[img].base;
	if (!PyList_Check(records) || !PyDict_Check(meta) ||
	    (!by_offset && !PyList_Check(sources))) {
		PyErr_SetString(PyExc_TypeError, "nvio: ZipImage: an archive is (base, records "
				"list, meta dict, sources list or address, dir_offset, size)");
		return -1;
	}
	if (by_offset) {
		void *v = PyLong_AsVoidPtr(sources);
		if (!v && PyErr_Occurred())
			return -1;
		src_base = (uint64_t)(uintptr_t)v;
	}
	Py_ssize_t n = PyList_Size(records);
	Py_ssize_t ns = by_offset ? 0 : PyList_Size(sources), next_src = 0;
	if (n < 0 || ns < 0)
		return -1;
	if ((uint64_t)n > UINT32_MAX / 4 - z->nrecs) {
		PyErr_Format(PyExc_ValueError, "nvio: ZipImage: %zd more records after %u", n,
			     z->nrecs);
		return -1;
	}
	void *arr = z->recs;
	int rc = reserve(&arr, &z->recs_cap, (uint64_t)z->nrecs + (uint64_t)n, sizeof(*z->recs));
	z->recs = arr;
	if (rc < 0)
		return -1;
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *o = PyList_GetItem(records, i);
		uint32_t ri = z->nrecs;
		struct zrec *r = &z->recs[ri];
		PyObject *local, *m;
		Py_ssize_t len;
		const unsigned char *p;
		uint64_t data_offset;
		if (rec_read(o, r, 0) < 0)
			return -1;
		z->nrecs++;
		z->imgs[img].n++;
		if (attr_u64(o, "data_offset", &data_offset) < 0)
			return -1;
		local = PyObject_GetAttrString(o, "local");
		if (!local)
			return -1;
		p = kept_bytes(z, local, &len, r->name, "local header");
		Py_DECREF(local);
		if (!p)
			return -1;
		if (r->header_offset + (uint64_t)len != data_offset) {
			PyErr_Format(PyExc_ValueError, "nvio: zip record %R: a local header of "
				     "%zd bytes at %llu, data at %llu", r->name, len,
				     (unsigned long long)r->header_offset,
				     (unsigned long long)data_offset);
			return -1;
		}
		if (add_piece(z, base + r->header_offset, (uint64_t)len, PIECE_BYTES, p, 0) < 0)
			return -1;
		m = PyDict_GetItemWithError(meta, r->name);	/* borrowed */
		if (m) {		/* a small record: its crc is known */
			uint64_t crc;
			if (attr_u64(o, "crc", &crc) < 0)
				return -1;
			r->crc = (uint32_t)crc;
			r->done = r->size;
			if (!(p = kept_bytes(z, m, &len, r->name, "content")))
				return -1;
			if ((uint64_t)len != r->size) {
				PyErr_Format(PyExc_ValueError, "nvio: zip record %R: %zd bytes "
					     "for a record of %llu", r->name, len,
					     (unsigned long long)r->size);
				return -1;
			}
			if (add_piece(z, base + data_offset, r->size, PIECE_BYTES, p, 0) < 0)
				return -1;
		} else if (PyErr_Occurred()) {
			return -1;
		} else {		/* tensor bytes: the next source */
			uint64_t src = src_base + data_offset, crc = 0;
			r->is_data = 1;
			if (!z->checksum && attr_u64(o, "crc", &crc) < 0)
				return -1;	/* kept as given */
			r->crc = (uint32_t)crc;
			if (!by_offset) {
				if (next_src >= ns) {
					PyErr_Format(PyExc_ValueError, "nvio: zip image: %zd "
						     "sources for more data records", ns);
					return -1;
				}
				PyObject *a = PyList_GetItem(sources, next_src++);
				void *v = a ? PyLong_AsVoidPtr(a) : NULL;
				if (!v && PyErr_Occurred())
					return -1;
				src = (uint64_t)(uintptr_t)v;
			}
			if (!src && r->size) {
				PyErr_Format(PyExc_ValueError, "nvio: zip record %R: address 0 "
					     "for %llu bytes", r->name, (unsigned long long)r->size);
				return -1;
			}
			if (add_piece(z, base + data_offset, r->size, PIECE_DATA,
				      (const unsigned char *)(uintptr_t)src, ri) < 0)
				return -1;
		}
		if (add_piece(z, base + data_offset + r->size, r->zip64 ? 24 : 16, PIECE_DESC,
			      NULL, ri) < 0)
			return -1;
	}
	if (!by_offset && next_src != ns) {
		PyErr_Format(PyExc_ValueError, "nvio: zip image: %zd sources for %zd data "
			     "records", ns, next_src);
		return -1;
	}
	return 0;
}

/* Ends open archive img with its directory at dir_offset: size bytes in
 * all. 0, or -1 with an exception set. */
static int image_close(ZipImageObject *z, uint32_t img, uint64_t dir_offset, uint64_t size)
{
	struct zimg *im = &z->imgs[img];
	uint64_t base = im->base;
	if (dir_offset > size) {
		PyErr_Format(PyExc_ValueError, "nvio: ZipImage: an archive of %llu bytes with "
			     "its directory at %llu", (unsigned long long)size,
			     (unsigned long long)dir_offset);
		return -1;
	}
	im->dir_offset = dir_offset;
	im->open = 0;
	if (add_piece(z, base + dir_offset, size - dir_offset, PIECE_DIR, NULL, img) < 0)
		return -1;
	if (z->npieces && z->pieces[z->npieces - 1].end != base + size) {
		PyErr_Format(PyExc_ValueError, "nvio: zip image: the records end at %llu, "
			     "the archive at %llu", (unsigned long long)z->pieces[z->npieces - 1].end,
			     (unsigned long long)(base + size));
		return -1;
	}
	return 0;
}

/* Adds the pieces of one whole archive at file offset base (see
 * image_records; its directory at dir_offset, size bytes in all). */
static int add_image(ZipImageObject *z, uint64_t base, PyObject *records, PyObject *meta,
		     PyObject *sources, uint64_t dir_offset, uint64_t size)
{
	int64_t img = image_open(z, base);
	if (img < 0 || image_records(z, (uint32_t)img, records, meta, sources) < 0)
		return -1;
	return image_close(z, (uint32_t)img, dir_offset, size);
}

/* Adds one item of the constructor's list: (base, bytes) or an archive. */
static int add_item(ZipImageObject *z, PyObject *item, Py_ssize_t i)
{
	PyObject *b, *records, *meta, *sources;
	unsigned long long base, dir_offset, size;
	if (PyTuple_Check(item) && PyTuple_Size(item) == 2) {
		if (!PyArg_ParseTuple(item, "KO!", &base, &PyBytes_Type, &b))
			return -1;
		if (PyList_Append(z->keep, b) < 0)
			return -1;
		return add_piece(z, base, (uint64_t)PyBytes_Size(b), PIECE_BYTES,
				 (const unsigned char *)PyBytes_AsString(b), 0);
	}
	if (!PyTuple_Check(item) || PyTuple_Size(item) != 6) {
		PyErr_Format(PyExc_TypeError, "nvio: ZipImage: item %zd is neither (base, bytes) "
			     "nor (base, records, meta, sources, dir_offset, size)", i);
		return -1;
	}
	if (!PyArg_ParseTuple(item, "KOOOKK", &base, &records, &meta, &sources, &dir_offset,
			      &size))
		return -1;
	return add_image(z, base, records, meta, sources, dir_offset, size);
}

static void zi_dealloc(PyObject *o)
{
	ZipImageObject *z = (ZipImageObject *)o;
	PyTypeObject *tp = Py_TYPE(o);
	recs_free(z->recs, z->nrecs);
	for (uint32_t i = 0; i < z->nimgs; i++)
		PyMem_Free(z->imgs[i].dir);
	PyMem_Free(z->imgs);
	PyMem_Free(z->pieces);
	for (unsigned i = 0; z->parts && i < z->nparts; i++)
		free(z->parts[i].v);
	PyMem_Free(z->parts);
	Py_XDECREF(z->keep);
	freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
	f(o);
	Py_DECREF(tp);
}

static PyObject *zi_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = { "items", "size", "nparts", "zip64_limit", "checksum", NULL };
	PyObject *items;
	unsigned long long size, limit;
	unsigned nparts;
	int checksum = 1;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "O!KIK|p:ZipImage", kwlist, &PyList_Type,
					 &items, &size, &nparts, &limit, &checksum))
		return NULL;
	if (nparts < 1 || nparts > 64) {
		PyErr_Format(PyExc_ValueError, "nvio: ZipImage: nparts %u (1-64)", nparts);
		return NULL;
	}
	allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
	ZipImageObject *z = (ZipImageObject *)alloc(type, 0);
	if (!z)
		return NULL;
	z->size = size;
	z->limit = limit;
	z->nparts = nparts;
	z->checksum = checksum;
	z->keep = PyList_New(0);
	z->parts = PyMem_Calloc(nparts, sizeof(*z->parts));
	if (!z->keep || !z->parts) {
		if (!PyErr_Occurred())
			PyErr_NoMemory();
		goto fail;
	}
	for (Py_ssize_t i = 0; i < PyList_Size(items); i++)
		if (add_item(z, PyList_GetItem(items, i), i) < 0)
			goto fail;
	if (z->npieces && z->pieces[z->npieces - 1].end > size) {
		PyErr_Format(PyExc_ValueError, "nvio: ZipImage: the items end at %llu, after "
			     "the file's %llu bytes",
			     (unsigned long long)z->pieces[z->npieces - 1].end, size);
		goto fail;
	}
	if (add_piece(z, size, 0, PIECE_ZERO, NULL, 0) < 0)	/* zeros up to size */
		goto fail;
	return (PyObject *)z;
fail:
	Py_DECREF(z);
	return NULL;
}

/* The first piece that ends after off. */
static uint32_t first_after(const ZipImageObject *z, uint64_t off)
{
	uint32_t lo = 0, hi = z->npieces;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (z->pieces[mid].end <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Bytes copied, then checksummed while still in the core's cache. */
#define ZI_STEP (32u << 10)

static int window_args(ZipImageObject *z, PyObject *args, const char *fn,
		       unsigned char **base, uint64_t *w0, uint64_t *w1, unsigned *part)
{
	PyObject *pb;
	unsigned long long a, b;
	unsigned p = 0;
	if (!PyArg_ParseTuple(args, part ? "OKKI" : "OKK", &pb, &a, &b, &p))
		return -1;
	*base = PyLong_AsVoidPtr(pb);
	if (!*base && PyErr_Occurred())
		return -1;
	if (!*base || a > b || b > z->size || (part && p >= z->nparts)) {
		PyErr_Format(PyExc_ValueError, "nvio: ZipImage.%s: window [%llu, %llu) of a "
			     "%llu-byte image, part %u of %u, base %p", fn, a, b,
			     (unsigned long long)z->size, p, z->nparts, (void *)*base);
		return -1;
	}
	*w0 = a;
	*w1 = b;
	if (part)
		*part = p;
	return 0;
}

static PyObject *zi_copy(PyObject *o, PyObject *args)
{
	ZipImageObject *z = (ZipImageObject *)o;
	unsigned char *base;
	uint64_t w0, w1;
	unsigned part;
	if (window_args(z, args, "copy", &base, &w0, &w1, &part) < 0)
		return NULL;
	if (z->broken) {
		PyErr_SetString(PyExc_RuntimeError, "nvio: ZipImage.copy: the image is "
				"incomplete (an extend() failed)");
		return NULL;
	}
	struct part *pt = &z->parts[part];
	uint64_t span = w1 - w0;
	uint64_t lo = w0 + span * part / z->nparts, hi = w0 + span * (part + 1) / z->nparts;
	pt->n = 0;
	pt->failed = 0;
	z->copying++;		/* under the GIL: extend() refuses meanwhile */
	Py_BEGIN_ALLOW_THREADS
	for (uint32_t i = first_after(z, lo); i < z->npieces && z->pieces[i].off < hi; i++) {
		const struct piece *pc = &z->pieces[i];
		if (pc->kind != PIECE_DATA)
			continue;
		uint64_t a = pc->off > lo ? pc->off : lo, b = pc->end < hi ? pc->end : hi;
		unsigned char *d = base + (a - w0);
		const unsigned char *s = pc->p + (a - pc->off);
		uint32_t crc = 0;
		if (!z->checksum) {
			if (d != s)
				memcpy(d, s, (size_t)(b - a));
		} else if (d == s) {
			crc = nvio_crc32(0, d, b - a);
		} else {
			for (uint64_t k = 0; k < b - a; k += ZI_STEP) {
				size_t m = (size_t)(b - a - k < ZI_STEP ? b - a - k : ZI_STEP);
				memcpy(d + k, s + k, m);
				crc = nvio_crc32(crc, d + k, m);
			}
		}
		if (pt->n == pt->cap) {
			size_t cap = pt->cap ? 2 * pt->cap : 256;
			struct frag *v = realloc(pt->v, cap * sizeof(*v));
			if (!v) {
				pt->failed = 1;
				break;
			}
			pt->v = v;
			pt->cap = cap;
		}
		pt->v[pt->n++] = (struct frag){ a, b - a, i, crc };
	}
	Py_END_ALLOW_THREADS
	z->copying--;
	if (pt->failed)
		return PyErr_NoMemory();
	Py_RETURN_NONE;
}

/* The crc attribute of every tensor record of an archive, from the CRCs. */
static int store_crcs(ZipImageObject *z, const struct zimg *img)
{
	for (uint32_t i = img->r0; z->checksum && i < img->r0 + img->n; i++) {
		if (!z->recs[i].is_data)
			continue;
		PyObject *v = PyLong_FromUnsignedLong(z->recs[i].crc);
		if (!v || PyObject_SetAttrString(z->recs[i].obj, "crc", v) < 0) {
			Py_XDECREF(v);
			return -1;
		}
		Py_DECREF(v);
	}
	return 0;
}

static PyObject *zi_fill(PyObject *o, PyObject *args)
{
	ZipImageObject *z = (ZipImageObject *)o;
	unsigned char *base;
	uint64_t w0, w1;
	if (window_args(z, args, "fill", &base, &w0, &w1, NULL) < 0)
		return NULL;
	if (z->broken) {
		PyErr_SetString(PyExc_RuntimeError, "nvio: ZipImage.fill: the image is "
				"incomplete (an extend() failed)");
		return NULL;
	}
	if (w0 != z->filled) {
		PyErr_Format(PyExc_ValueError, "nvio: ZipImage.fill: window [%llu, %llu) "
			     "after bytes up to %llu were filled (windows go in order)",
			     (unsigned long long)w0, (unsigned long long)w1,
			     (unsigned long long)z->filled);
		return NULL;
	}
	/* the window's CRCs, part by part, in file order */
	for (unsigned p = 0; p < z->nparts; p++) {
		struct part *pt = &z->parts[p];
		for (size_t k = 0; k < pt->n; k++) {
			const struct frag *f = &pt->v[k];
			const struct piece *pc = &z->pieces[f->piece];
			struct zrec *r = &z->recs[pc->rec];
			if (f->off != pc->off + r->done) {
				PyErr_Format(PyExc_RuntimeError, "nvio: ZipImage.fill: bytes "
					     "%llu-%llu of %R checksummed after its first %llu "
					     "(a window copied twice, or not copied)",
					     (unsigned long long)(f->off - pc->off),
					     (unsigned long long)(f->off - pc->off + f->len),
					     r->name, (unsigned long long)r->done);
				return NULL;
			}
			if (z->checksum)
				r->crc = r->done ? nvio_crc32_combine(r->crc, f->crc, f->len)
					: f->crc;
			r->done += f->len;
		}
		pt->n = 0;
	}
	for (uint32_t i = first_after(z, w0); i < z->npieces && z->pieces[i].off < w1; i++) {
		const struct piece *pc = &z->pieces[i];
		uint64_t a = pc->off > w0 ? pc->off : w0, b = pc->end < w1 ? pc->end : w1;
		const unsigned char *src = pc->p;
		unsigned char desc[24];
		if (pc->kind == PIECE_DATA) {
			if (b == pc->end && z->recs[pc->rec].done != pc->end - pc->off) {
				PyErr_Format(PyExc_RuntimeError, "nvio: ZipImage.fill: the data "
					     "of %R is not copied (window [%llu, %llu))",
					     z->recs[pc->rec].name, (unsigned long long)w0,
					     (unsigned long long)w1);
				return NULL;
			}
			continue;
		}
		if (pc->kind == PIECE_DESC) {
			const struct zrec *r = &z->recs[pc->rec];
			if (r->done != r->size) {
				PyErr_Format(PyExc_RuntimeError, "nvio: ZipImage.fill: the "
					     "descriptor of %R before its CRC is known", r->name);
				return NULL;
			}
			le32(desc, 0x08074B50u);
			le32(desc + 4, r->crc);
			if (r->zip64) {
				le64(desc + 8, r->size);
				le64(desc + 16, r->size);
			} else {
				le32(desc + 8, (uint32_t)r->size);
				le32(desc + 12, (uint32_t)r->size);
			}
			src = desc;
		} else if (pc->kind == PIECE_DIR) {
			struct zimg *img = &z->imgs[pc->rec];
			if (!img->dir) {
				PyObject *d = directory_bytes(z->recs + img->r0, img->n,
							      img->dir_offset, z->limit);
				if (!d)
					return NULL;
				Py_ssize_t n = PyBytes_Size(d);
				if ((uint64_t)n != pc->end - pc->off) {
					PyErr_Format(PyExc_RuntimeError, "nvio: the directory of "
						     "a zip image is %zd bytes where %llu were "
						     "laid out", n,
						     (unsigned long long)(pc->end - pc->off));
					Py_DECREF(d);
					return NULL;
				}
				img->dir = PyMem_Malloc((size_t)n);
				if (!img->dir) {
					Py_DECREF(d);
					return PyErr_NoMemory();
				}
				memcpy(img->dir, PyBytes_AsString(d), (size_t)n);
				Py_DECREF(d);
				if (store_crcs(z, img) < 0)
					return NULL;
			}
			src = img->dir;
		} else if (pc->kind == PIECE_ZERO) {
			memset(base + (a - w0), 0, (size_t)(b - a));
			continue;
		}
		memcpy(base + (a - w0), src + (a - pc->off), (size_t)(b - a));
	}
	z->filled = w1;
	Py_RETURN_NONE;
}

/*
 * extend(base, records, meta, sources, dir_offset=-1, size=-1): more
 * records of the archive at file offset base, which stays open for more
 * until a call gives dir_offset and size (its directory's place and the
 * archive's length: it is closed then). Until it is closed, the image
 * ends where its last record's descriptor does, and windows up to there
 * may be copied and filled: a writer can start on the first records of
 * an archive before the last are laid out (nvio.save's records as its
 * pickler meets the storages). Never while a copy() of the image runs
 * (pieces move in memory).
 */
static PyObject *zi_extend(PyObject *o, PyObject *args)
{
	ZipImageObject *z = (ZipImageObject *)o;
	unsigned long long base;
	long long dir_offset = -1, size = -1;
	PyObject *records, *meta, *sources;
	if (!PyArg_ParseTuple(args, "KOOO|LL:extend", &base, &records, &meta, &sources,
			      &dir_offset, &size))
		return NULL;
	if (z->copying || z->broken) {
		PyErr_SetString(PyExc_RuntimeError, z->copying
				? "nvio: ZipImage.extend while a copy() of it runs"
				: "nvio: ZipImage.extend: the image is incomplete (an earlier "
				  "extend() failed)");
		return NULL;
	}
	if ((dir_offset < 0) != (size < 0)) {
		PyErr_SetString(PyExc_ValueError, "nvio: ZipImage.extend: dir_offset and size "
				"come together (they close the archive)");
		return NULL;
	}
	uint64_t end = z->npieces ? z->pieces[z->npieces - 1].end : 0;
	int64_t img = -1;
	if (z->nimgs && z->imgs[z->nimgs - 1].open) {
		img = z->nimgs - 1;
		if (z->imgs[img].base != base) {
			PyErr_Format(PyExc_ValueError, "nvio: ZipImage.extend: the open archive "
				     "starts at %llu, not %llu",
				     (unsigned long long)z->imgs[img].base, base);
			return NULL;
		}
	} else if (base < end || base < z->size) {
		PyErr_Format(PyExc_ValueError, "nvio: ZipImage.extend: an archive at %llu "
			     "inside the image's %llu bytes", base,
			     (unsigned long long)(end > z->size ? end : z->size));
		return NULL;
	}
	z->broken = 1;		/* until the pieces are whole again */
	if (img < 0 && (img = image_open(z, base)) < 0)
		return NULL;
	if (image_records(z, (uint32_t)img, records, meta, sources) < 0)
		return NULL;
	if (size >= 0 && image_close(z, (uint32_t)img, (uint64_t)dir_offset,
				     (uint64_t)size) < 0)
		return NULL;
	z->broken = 0;
	end = z->npieces ? z->pieces[z->npieces - 1].end : 0;
	if (end > z->size)
		z->size = end;
	Py_RETURN_NONE;
}

static PyMethodDef zi_methods[] = {
	{ "extend", zi_extend, METH_VARARGS,
	  "extend(base, records, meta, sources, dir_offset=-1, size=-1)\n--\n\nMore records of "
	  "the open archive at base (opened by the first call);\ndir_offset and size close it. "
	  "Never while a copy() runs." },
	{ "copy", zi_copy, METH_VARARGS,
	  "copy(base, w0, w1, part)\n--\n\nCopy and checksum part `part` of the tensor bytes of "
	  "window\n[w0, w1) to base + (offset - w0), the GIL released." },
	{ "fill", zi_fill, METH_VARARGS,
	  "fill(base, w0, w1)\n--\n\nOnce every part of the window is copied: join its CRCs and\n"
	  "write its headers, small records, descriptors and directory." },
	{ NULL, NULL, 0, NULL }
};

static PyType_Slot zi_slots[] = {
	{ Py_tp_new, zi_new },
	{ Py_tp_dealloc, zi_dealloc },
	{ Py_tp_methods, zi_methods },
	{ Py_tp_doc, "ZipImage(items, size, nparts, zip64_limit, checksum=True)\n--\n\n"
		     "A file of laid-out torch.save zip archives filled window by window\n"
		     "(see nvio/_ext/zipimage.c). items: (base, records, meta, sources,\n"
		     "dir_offset, size) for an archive at base, (base, bytes) for raw bytes;\n"
		     "sources: the address of each tensor record's bytes in file order, or\n"
		     "one address A where each record's bytes are at A + its data offset." },
	{ 0, NULL }
};

static PyType_Spec zi_spec = {
	"nvio._nvio.ZipImage", sizeof(ZipImageObject), 0, Py_TPFLAGS_DEFAULT, zi_slots
};

static PyObject *m_zip_directory(PyObject *m, PyObject *args)
{
	(void)m;
	PyObject *records;
	unsigned long long cursor, limit;
	if (!PyArg_ParseTuple(args, "O!KK:zip_directory", &PyList_Type, &records, &cursor,
			      &limit))
		return NULL;
	Py_ssize_t n = PyList_Size(records);
	if (n > (Py_ssize_t)UINT32_MAX / 4) {
		PyErr_SetString(PyExc_OverflowError, "nvio: zip_directory: too many records");
		return NULL;
	}
	struct zrec *recs = PyMem_Calloc((size_t)n + 1, sizeof(*recs));
	if (!recs)
		return PyErr_NoMemory();
	PyObject *out = NULL;
	uint32_t got = 0;
	for (; got < (uint32_t)n; got++)
		if (rec_read(PyList_GetItem(records, got), &recs[got], 1) < 0)
			goto done;
	out = directory_bytes(recs, got, cursor, limit);
done:
	recs_free(recs, got);
	return out;
}

/*
 * zip_local_header(name, size, cursor, align, zip64_limit) -> (header,
 * data offset): the local header of a record whose header starts at
 * cursor and whose data must start on a multiple of align: the fixed
 * part (CRC and sizes in the descriptor after the data), the UTF-8 name,
 * a zip64 field when size >= zip64_limit, and torch's padding field
 * ("FB", filled with "Z") up to the data. Where the data starts is
 * torchzip.data_start(), which loaders use to predict offsets.
 */
static PyObject *m_zip_local_header(PyObject *m, PyObject *args)
{
	(void)m;
	PyObject *name;
	unsigned long long size, cursor, align, limit;
	if (!PyArg_ParseTuple(args, "UKKKK:zip_local_header", &name, &size, &cursor, &align,
			      &limit))
		return NULL;
	Py_ssize_t nl;
	const char *nb = PyUnicode_AsUTF8AndSize(name, &nl);
	if (!nb)
		return NULL;
	if (!align || (align & (align - 1)) || nl > 0xFFFF) {
		PyErr_Format(PyExc_ValueError, "nvio: zip record %R: align %llu (a power of "
			     "two), a name of %zd bytes (at most 65535)", name, align, nl);
		return NULL;
	}
	int zip64 = size >= limit;
	uint64_t start = cursor + 30 + (uint64_t)nl + (zip64 ? 20 : 0) + 4;
	uint64_t pad = (align - start % align) % align;
	uint64_t xlen = (zip64 ? 20 : 0) + 4 + pad;
	if (xlen > 0xFFFF) {
		PyErr_Format(PyExc_ValueError, "nvio: zip record %R: %llu bytes of padding to "
			     "align its data to %llu (a zip extra field holds at most 65535)",
			     name, (unsigned long long)pad, align);
		return NULL;
	}
	PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(30 + nl + xlen));
	if (!out)
		return NULL;
	unsigned char *p = (unsigned char *)PyBytes_AsString(out);
	uint32_t sz = zip64 ? 0xFFFFFFFFu : 0;
	le32(p, 0x04034B50u);
	le16(p + 4, zip64 ? 45 : 20);
	le16(p + 6, (1u << 3) | (1u << 11));	/* descriptor, UTF-8 */
	le16(p + 8, 0);				/* stored */
	le16(p + 10, 0);
	le16(p + 12, 0);
	le32(p + 14, 0);			/* CRC: in the descriptor */
	le32(p + 18, sz);
	le32(p + 22, sz);
	le16(p + 26, (unsigned)nl);
	le16(p + 28, (unsigned)xlen);
	memcpy(p + 30, nb, (size_t)nl);
	p += 30 + nl;
	if (zip64) {		/* sizes unknown in advance: in the descriptor */
		le16(p, 0x0001);
		le16(p + 2, 16);
		le64(p + 4, 0);
		le64(p + 12, 0);
		p += 20;
	}
	le16(p, 0x4246);			/* "FB": torch's padding field */
	le16(p + 2, (unsigned)pad);
	memset(p + 4, 'Z', (size_t)pad);
	return Py_BuildValue("(NK)", out, (unsigned long long)(start + pad));
}

static PyMethodDef zip_functions[] = {
	{ "zip_local_header", m_zip_local_header, METH_VARARGS,
	  "zip_local_header(name, size, cursor, align, zip64_limit)\n--\n\n(header bytes, data "
	  "offset) of a zip record whose header\nstarts at cursor and whose data starts on a "
	  "multiple of align." },
	{ "zip_directory", m_zip_directory, METH_VARARGS,
	  "zip_directory(records, cursor, zip64_limit)\n--\n\nThe central directory and end "
	  "records of zip records\n(name, size, header_offset, crc) whose directory starts at "
	  "cursor." },
	{ NULL, NULL, 0, NULL }
};

int ext_zip_exec(PyObject *m, ext_state *st)
{
	(void)st;
	PyObject *t = PyType_FromModuleAndSpec(m, &zi_spec, NULL);
	if (!t)
		return -1;
	int rc = PyModule_AddObjectRef(m, "ZipImage", t);
	Py_DECREF(t);
	if (rc < 0)
		return -1;
	return PyModule_AddFunctions(m, zip_functions);
}
