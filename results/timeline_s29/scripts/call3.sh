for t in old new old new; do
  if [ $t = old ]; then python _ab/int4_ab.py _ab/old old 2>&1 | grep '^{'; else python _ab/int4_ab.py . new 2>&1 | grep '^{'; fi
done > $OUT/int4_ab.jsonl
cat $OUT/int4_ab.jsonl
python _ab/pdl_ab.py 2>&1 | grep -v Warning | tail -2
