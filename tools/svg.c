/*
 * svg.c - `nvio tune --plot`: bandwidth over the explored space as an SVG
 * written directly. One row per direction, one panel per tuning step
 * (block size, queue depth, parallelism, submit/overlap, engine), a bar per
 * measured value in the order tried, the winner in green and the nvio
 * defaults as a dashed line.
 */
#include "tool.h"

#include <errno.h>
#include <string.h>

#define PANEL_W 240
#define PANEL_H 220
#define LEFT 60
#define TOP 70
#define PLOT_W 190
#define PLOT_H 140
#define FIRST_STEP 1	/* block size */
#define NPANELS 5	/* block size .. engine */

static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '&': fputs("&amp;", f); break;
		case '"': fputs("&quot;", f); break;
		default:
			if ((unsigned char)*s >= 0x20)
				fputc(*s, f);
		}
	}
}

struct row {
	int is_write;
	double ymax;
	double def;	/* GB/s of the nvio defaults, 0 if not measured */
};

static void row_scale(struct row *r, const struct tune_point *pts, int n)
{
	r->ymax = 0;
	r->def = 0;
	for (int i = 0; i < n; i++) {
		if (pts[i].is_write != r->is_write)
			continue;
		if (pts[i].gbps > r->ymax)
			r->ymax = pts[i].gbps;
		if (pts[i].step == 0)
			r->def = pts[i].gbps;
	}
	r->ymax = r->ymax > 0 ? r->ymax * 1.15 : 1;
}

static void axes(FILE *f, double x0, double y0, const struct row *r)
{
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
		"stroke=\"#333\"/>\n", x0, y0, x0, y0 + PLOT_H);
	fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
		"stroke=\"#333\"/>\n", x0, y0 + PLOT_H, x0 + PLOT_W, y0 + PLOT_H);
	for (int k = 0; k <= 2; k++) {
		double y = y0 + PLOT_H - PLOT_H * k / 2.0;

		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" "
			"text-anchor=\"end\">%.2f</text>\n", x0 - 3, y + 3,
			r->ymax * k / 2);
	}
	if (r->def > 0) {
		double y = y0 + PLOT_H - PLOT_H * r->def / r->ymax;

		fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
			"y2=\"%.1f\" stroke=\"#c33\" stroke-dasharray=\"4 3\"/>\n",
			x0, y, x0 + PLOT_W, y);
	}
}

static void bars(FILE *f, double x0, double y0, const struct row *r,
		 int step, const struct tune_point *pts, int n)
{
	int count = 0, k = 0;
	char label[64];

	for (int i = 0; i < n; i++)
		count += pts[i].is_write == r->is_write && pts[i].step == step;
	for (int i = 0; i < n; i++) {
		const struct tune_point *p = &pts[i];
		double slot, h, x;

		if (p->is_write != r->is_write || p->step != step)
			continue;
		slot = (double)PLOT_W / count;
		h = PLOT_H * p->gbps / r->ymax;
		x = x0 + slot * k++ + slot * 0.15;
		fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
			"height=\"%.1f\" fill=\"%s\"><title>%.3f GB/s</title>"
			"</rect>\n", x, y0 + PLOT_H - h, slot * 0.7, h,
			p->best ? "#2ca02c" : "#4878a8", p->gbps);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"8\" "
			"text-anchor=\"middle\">%.2f</text>\n", x + slot * 0.35,
			y0 + PLOT_H - h - 2, p->gbps);
		fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"8\" "
			"text-anchor=\"middle\">", x + slot * 0.35,
			y0 + PLOT_H + 11);
		xml_text(f, tune_point_label(&p->cfg, step, label,
					     sizeof(label)));
		fputs("</text>\n", f);
	}
}

static void panel(FILE *f, int rowi, int col, const struct row *r,
		  const struct tune_point *pts, int n)
{
	double px = LEFT + col * PANEL_W, py = TOP + rowi * PANEL_H;
	double x0 = px + 35, y0 = py + 25;
	int step = FIRST_STEP + col;

	fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
		"text-anchor=\"middle\">", x0 + PLOT_W / 2.0, py + 12);
	xml_text(f, tune_step_names[step]);
	fputs("</text>\n", f);
	axes(f, x0, y0, r);
	bars(f, x0, y0, r, step, pts, n);
}

static void header(FILE *f, int width, int height, const char *title)
{
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" "
		"height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
		width, height, width, height);
	fputs("<text x=\"20\" y=\"28\" font-size=\"16\">nvio tune: ", f);
	xml_text(f, title);
	fputs("</text>\n<text x=\"20\" y=\"48\" font-size=\"11\" fill=\"#555\">"
	      "bandwidth in GB/s (GB = 10^9 bytes) of each configuration tried, "
	      "in order; green: the winner; dashed red: nvio defaults</text>\n",
	      f);
}

int svg_write(FILE *f, const char *title, const struct tune_point *pts,
	      int n)
{
	struct row rows[2];
	int nrows = 0;

	for (int w = 1; w >= 0; w--)
		for (int i = 0; i < n; i++)
			if (pts[i].is_write == w) {
				rows[nrows++].is_write = w;
				break;
			}
	header(f, LEFT + NPANELS * PANEL_W + 20, TOP + nrows * PANEL_H + 10,
	       title);
	for (int ri = 0; ri < nrows; ri++) {
		double ymid = TOP + ri * PANEL_H + 25 + PLOT_H / 2.0;

		row_scale(&rows[ri], pts, n);
		fprintf(f, "<text x=\"30\" y=\"%.1f\" font-size=\"13\" "
			"text-anchor=\"middle\" transform=\"rotate(-90 30 %.1f)\">"
			"%s GB/s</text>\n", ymid, ymid,
			rows[ri].is_write ? "write" : "read");
		for (int c = 0; c < NPANELS; c++)
			panel(f, ri, c, &rows[ri], pts, n);
	}
	fputs("</svg>\n", f);
	return ferror(f) ? -EIO : 0;
}
