"""The documented DuckDB queries over a Parquet export (``spectrace export``): the figures of
``spectrace info`` per run and rank, and of ``spectrace diff`` for two runs (the README
shows them verbatim; tests/test_export.py runs them and compares with both commands).

``{out}`` is the export folder; ``$ours`` / ``$theirs`` are run names (DuckDB parameters).
Requests pair by identical prompt ids, the n-th request of a prompt with the n-th on the
other side (``spectrace diff`` also pairs requests without prompt ids by request id, then
order: not done here); a block is on matched content when its anchor position is before the
first token where the two full sequences differ and before the last token of the shorter
one (any position when either side lacks output ids), or at that last token, before the
first difference, when the other side has a block there too (a request's final proposal
that both drafted, or one that meets the longer output's block there); blocks pair by
(request pair, anchor position), the first block of each position on each side.
"""

from __future__ import annotations

#: Per run and rank: blocks, recorded acceptance, per-position acceptance (the survival
#: curve over max(k) slots): ``spectrace info``'s ``blocks`` and ``recorded`` figures. A
#: block whose target checked no draft (k 0, or every draft trimmed) is no verified block,
#: as in :func:`spectrace.tracer.metrics.acceptance_counts`.
RUN_FIGURES = """
WITH b AS (
  SELECT run, rank, k,
         CASE WHEN impossible OR checked = 0 THEN -1 ELSE accepted END AS accepted, checked
  FROM (SELECT *, CASE WHEN num_verified >= 0 THEN num_verified ELSE k END AS checked
        FROM read_parquet('{out}/blocks/*/*/*.parquet', hive_partitioning = true))
)
SELECT run, rank,
       count(*) AS blocks,
       count(*) FILTER (accepted >= 0) AS verified_blocks,
       sum(checked) FILTER (accepted >= 0) AS verified_tokens,
       sum(accepted) FILTER (accepted >= 0) AS accepted_tokens,
       accepted_tokens / verified_tokens AS acceptance_rate,
       1 + accepted_tokens / verified_blocks AS mean_acceptance_length,
       list_transform(range(max(k)), lambda i:
         len(list_filter(list(accepted) FILTER (accepted >= 0), lambda a: a > i))
         / verified_blocks) AS per_position
FROM b
GROUP BY run, rank
ORDER BY run, rank
"""

#: Two runs paired by request and position: paired blocks, exact matches, per-slot
#: agreement and the blocks on matched content: ``spectrace diff``'s ``agreement`` and
#: ``coverage`` figures.
PAIR_FIGURES = """
WITH req AS (
  SELECT run, request, prompt_ids, len(output_ids) > 0 AS known,
         prompt_ids || output_ids AS seq,
         row_number() OVER (PARTITION BY run, prompt_ids ORDER BY request) AS nth
  FROM read_parquet('{out}/requests/*/*/*.parquet', hive_partitioning = true)
  WHERE len(prompt_ids) > 0
),
seqs AS (
  SELECT a.request AS ra, b.request AS rb, a.known AND b.known AS known,
         coalesce(list_position(list_transform(list_zip(a.seq, b.seq),
                                               lambda z: z[1] = z[2]), false) - 1,
                  len(a.seq) + len(b.seq)) AS div,
         least(len(a.seq), len(b.seq)) - 1 AS last
  FROM req a JOIN req b ON a.prompt_ids = b.prompt_ids AND a.nth = b.nth
  WHERE a.run = $ours AND b.run = $theirs
),
pairs AS (
  SELECT ra, rb, CASE WHEN known THEN least(div, last) ELSE 2147483647 END AS lim,
         CASE WHEN known AND last < div THEN last END AS fin
  FROM seqs
),
blk AS (
  SELECT run, request, position, block, k, proposed
  FROM read_parquet('{out}/blocks/*/*/*.parquet', hive_partitioning = true)
  WHERE run IN ($ours, $theirs)
),
ca AS (SELECT blk.*, p.ra, p.rb, blk.position < p.lim AS before FROM blk
       JOIN pairs p ON blk.request = p.ra
       WHERE blk.run = $ours AND (blk.position < p.lim OR blk.position = p.fin)),
cb AS (SELECT blk.*, p.ra, p.rb, blk.position < p.lim AS before FROM blk
       JOIN pairs p ON blk.request = p.rb
       WHERE blk.run = $theirs AND (blk.position < p.lim OR blk.position = p.fin)),
oa AS (FROM ca WHERE before OR EXISTS (FROM cb WHERE cb.ra = ca.ra AND cb.rb = ca.rb
                                                 AND cb.position = ca.position)),
ob AS (FROM cb WHERE before OR EXISTS (FROM ca WHERE ca.ra = cb.ra AND ca.rb = cb.rb
                                                 AND ca.position = cb.position)),
paired AS (
  SELECT a.k AS ka, b.k AS kb, a.proposed AS pa, b.proposed AS pb
  FROM (FROM oa QUALIFY row_number() OVER (PARTITION BY request, position ORDER BY block) = 1) a
  JOIN (FROM ob QUALIFY row_number() OVER (PARTITION BY request, position ORDER BY block) = 1) b
    ON a.ra = b.ra AND a.rb = b.rb AND a.position = b.position
),
slots AS (
  SELECT unnest(range(least(ka, kb))) AS slot, pa, pb FROM paired
),
per_slot AS (
  SELECT slot, count(*) AS present, count(*) FILTER (pa[slot + 1] = pb[slot + 1]) AS equal
  FROM slots GROUP BY slot
)
SELECT (SELECT count(*) FROM oa) AS ours_on_matched_content,
       (SELECT count(*) FROM ob) AS theirs_on_matched_content,
       (SELECT count(*) FROM paired) AS paired_blocks,
       (SELECT count(*) FILTER (ka = kb AND pa = pb) FROM paired) AS exact_matches,
       (SELECT count(*) FILTER (ka = kb AND pa = pb) / count(*) FROM paired) AS exact_match_rate,
       (SELECT list(equal / present ORDER BY slot) FROM per_slot) AS per_position,
       (SELECT list(present ORDER BY slot) FROM per_slot) AS per_position_blocks
"""

#: :data:`RUN_FIGURES` over all ranks of each run: ``spectrace info`` of the run's files read
#: as one trace (``spectrace info 'run.dp*.h5'``).
RUN_TOTALS = (
    RUN_FIGURES.replace("SELECT run, rank,\n", "SELECT run,\n")
    .replace("GROUP BY run, rank", "GROUP BY run")
    .replace("ORDER BY run, rank", "ORDER BY run")
)
