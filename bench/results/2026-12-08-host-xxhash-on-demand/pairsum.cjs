const fs=require('fs'),path=require('path');const d=process.argv[2];const key=process.argv[3]||'loadedReadyWallMsMedian';
const v={};for(const n of fs.readdirSync(d)){const m=n.match(/^(base|after)-(\d+)$/);if(!m)continue;try{v[n]=JSON.parse(fs.readFileSync(path.join(d,n,'summary.json')))[key]}catch{}}
const pairs=[];for(let i=1;v['base-'+i]!==undefined;i++)pairs.push([v['base-'+i],v['after-'+i]]);
const med=a=>{a=[...a].sort((x,y)=>x-y);const n=a.length;return n%2?a[n>>1]:(a[n/2-1]+a[n/2])/2};
console.log(key,'base',pairs.map(p=>p[0].toFixed(1)).join(' '),'\n after',pairs.map(p=>p[1].toFixed(1)).join(' '));
console.log(' medians',med(pairs.map(p=>p[0])).toFixed(1),med(pairs.map(p=>p[1])).toFixed(1),'paired',med(pairs.map(p=>p[1]-p[0])).toFixed(1),'faster',pairs.filter(p=>p[1]<p[0]).length,'of',pairs.length);
