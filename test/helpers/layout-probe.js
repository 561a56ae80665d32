// Runs in the browser (the status-page test adds it with page.addScriptTag): measures what the
// test asserts about the page's layout, from the DOM. Plain JS: it is not type-checked with Node's types.
window.layoutProbe = {
  /** Every element under `sel` that sticks out of its parent (unless the parent scrolls), or whose text is cut (overflow hidden, no title). */
  overflows(sel) {
    const out = [];
    const name = (e) => `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''}${typeof e.className === 'string' && e.className.trim() ? '.' + e.className.trim().split(/\s+/).join('.') : ''} "${(e.textContent || '').trim().slice(0, 40)}"`;
    for (const e of document.querySelectorAll(`${sel} *`)) {
      const p = e.parentElement;
      const r = e.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      const po = getComputedStyle(p).overflowX;
      if (po !== 'auto' && po !== 'scroll') {
        const q = p.getBoundingClientRect();
        if (r.left < q.left - 1 || r.right > q.right + 1) out.push(`${name(e)} [${r.left.toFixed(0)}, ${r.right.toFixed(0)}] outside ${name(p)} [${q.left.toFixed(0)}, ${q.right.toFixed(0)}]`);
      }
      if (e instanceof HTMLElement && getComputedStyle(e).overflowX === 'hidden' && e.scrollWidth > e.clientWidth + 1 && !e.title) out.push(`${name(e)}: text cut (${e.scrollWidth} > ${e.clientWidth}) with no title`);
    }
    return out;
  },
  /** The swaps' duration labels: their text, whether cut, and their right edge against the chart's. */
  values() {
    const box = document.getElementById('chart').getBoundingClientRect().right;
    return [...document.querySelectorAll('#chart .swap-value')].map((e) => ({ text: e.textContent, cut: e.scrollWidth > e.clientWidth + 1, right: e.getBoundingClientRect().right, box }));
  },
  /** Phase name and colour of each legend entry, and of each bar segment. */
  colours(sel) {
    return [...document.querySelectorAll(sel)].map((e) => ({ phase: e.getAttribute('data-phase'), color: getComputedStyle(e.querySelector('i') || e).backgroundColor }));
  },
  /** Each table under main, scrolled to its end: how its box scrolls, its cells, and its last column's right edge against the box's. */
  tables() {
    return [...document.querySelectorAll('main table')].map((t) => {
      const box = t.parentElement;
      box.scrollLeft = box.scrollWidth;
      const cells = [...t.querySelectorAll('thead th, tbody tr:first-child td')].map((c) => ({ text: (c.textContent || '').trim(), width: c.getBoundingClientRect().width, cut: c.scrollWidth > c.clientWidth + 1 }));
      return {
        id: t.querySelector('tbody').id,
        scrolls: getComputedStyle(box).overflowX,
        headers: t.tHead ? t.tHead.rows[0].cells.length : 0,
        cells,
        lastRight: t.querySelector('tr').lastElementChild.getBoundingClientRect().right,
        boxRight: box.getBoundingClientRect().right,
      };
    });
  },
};
